"""Pinned-memory arrays (a handler named for CUDA host memory) exported
through DLPack as plain CPU tensors: dlpack-device-mismatch."""
import numpy as np
import torch

import devhandler

old = devhandler.install()
a = np.arange(8, dtype=np.float32)  # <-- alloc
devhandler.restore(old)
t = torch.from_dlpack(a)  # <-- export
print("sum", float(t.sum()))
del t, a
