"""A Python allocator declared as pinned (CUDA host) memory: its arrays
handed to torch as plain CPU tensors are dlpack-device-mismatch."""
import json

import numpy as np
import torch

import capsan

pinned = capsan.allocator(name="pinned_demo", device="cuda_host")
with capsan.trace() as t:
    with capsan.using(pinned):
        b = np.arange(8.0)  # <-- alloc
    x = torch.from_dlpack(b)  # <-- export
    del x, b
print(json.dumps([[f.kind, f.python_lines()] for f in t.findings]))
