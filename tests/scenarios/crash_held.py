"""A process that dies by abort() while a consumer holds eight tensors it
took from NumPy (the crash is the verdict: live when killed)."""
import os

import numpy as np

import dlconsumer as C

for i in range(8):
    a = np.arange(16.0 * (i + 1))
    C.consume_hold(a.__dlpack__())  # <-- hold
print("holding 8", flush=True)
os.abort()  # <-- abort
