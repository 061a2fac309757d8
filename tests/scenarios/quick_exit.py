"""Programs that end with os._exit(), which runs no cleanup at all.

argv[1]:
  leak      a consumer reads three frames and never releases their numpy
            exports, then os._exit(0): the tensors are referenced nowhere
            any more (leaks, each with its buffer indirect)
  torch     torch tensors made from numpy arrays are alive in a global at
            os._exit(0): live, not leaked
  imports   import numpy, torch; os._exit(0): nothing but module data
"""
import os
import sys

import numpy as np

mode = sys.argv[1]
if mode == "leak":
    import dlconsumer as C
    for i in range(3):
        frame = np.full(8, i, dtype=np.float32)  # <-- alloc
        C.consume_leak(frame.__dlpack__())  # <-- consume-leak
    del frame
elif mode == "torch":
    import torch
    tensors = [torch.from_dlpack(np.full(16, i, dtype=np.float32)) for i in range(4)]  # <-- live
    arrays = [np.from_dlpack(torch.arange(8.0) + i) for i in range(4)]
elif mode == "imports":
    import torch  # noqa: F401
print("ending", mode, flush=True)
os._exit(0)
