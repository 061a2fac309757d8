"""A prefetcher exports batches for a consumer that never comes: the DLPack
capsules wait in a module-level list until the interpreter shuts down. Then
numpy's deleter declines to run (Py_IsInitialized() is 0), so each batch's
array really leaks (dlpack-leak, its buffer the indirect part).

argv[1]:
  keep     the bug: the capsules live until shutdown
  drop     the fix: the list is cleared before exit (clean)
  torch    the same list of capsules, exported by torch (its deleter frees at
           shutdown too: clean)
  held     numpy arrays consumed by torch, the tensors kept in a global until
           shutdown (numpy keeps the arrays alive on purpose, PR 22510: clean)
"""
import sys

import numpy as np

mode = sys.argv[1]
pending = []  # capsules prepared for a consumer


def prefetch(batch):
    pending.append(batch.__dlpack__())  # <-- export


if mode in ("keep", "drop"):
    for i in range(3):
        prefetch(np.full(16, i, dtype=np.float32))  # <-- alloc
elif mode == "torch":
    import torch
    for i in range(3):
        prefetch(torch.full((16,), float(i)))
elif mode == "held":
    import torch
    held = [torch.from_dlpack(np.full(16, i, dtype=np.float32)) for i in range(3)]
print("prefetched", len(pending), flush=True)
if mode == "drop":
    pending.clear()
print("survived", mode, flush=True)
