"""torch 1.13 ignores DLTensor.byte_offset (dlpack-byte-offset-ignored).

The fixture tensor holds 0..7 at data + 16; the 16 bytes before hold -1.0.
torch reads from data, so it silently sees [-1, -1, -1, -1, 0, 1, 2, 3].
argv[1]: "object" (torch.from_dlpack(obj with __dlpack__)) or "capsule".
"""
import sys

import torch

import dlproducer as P

if sys.argv[1] == "capsule":
    t = torch.from_dlpack(P.offset(8))  # <-- consume-cap
else:
    t = torch.from_dlpack(P.Exporter(8, "offset"))  # <-- consume
print("torch saw", t.tolist(), flush=True)
del t
