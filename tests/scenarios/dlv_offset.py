"""A versioned capsule with byte_offset 16 (the fixture puts 0..7 at
data + 16, -1.0 in the four floats before) handed to the current stack's
consumers. torch before 2.13 read from data and ignored byte_offset
(dlpack-byte-offset-ignored, see dl_byte_offset.py); torch 2.13 and
numpy 2 honor it: the right elements, and nothing to report."""
import numpy as np
import torch

import dlproducer as P


class Offset:
    """An object with __dlpack__ that answers with the offset capsule."""

    def __dlpack__(self, **kw):
        return P.versioned(8, offset=16)

    def __dlpack_device__(self):
        return (1, 0)


t = torch.from_dlpack(P.versioned(8, offset=16))  # <-- torch-capsule
print("torch capsule", t.tolist(), flush=True)
t2 = torch.from_dlpack(Offset())  # <-- torch-object
print("torch object", t2.tolist(), flush=True)
a = np.from_dlpack(Offset())  # <-- numpy-object
print("numpy object", a.tolist(), flush=True)
del t, t2, a
print("torch", torch.__version__, "deleted", P.deleted_count(), flush=True)
