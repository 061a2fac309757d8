"""A program registers a Python function with tvm-ffi (its registry keeps
the function, and with it this module's globals, past finalization) and
keeps tvm-ffi containers of torch tensors, taken through the exchange API,
in a global: those tensors are never deleted, but the program holds them
to its end: held, not leaked. A tensor the program really lost (a NumPy
array's lost reference) is still a leak."""
import ctypes

import numpy as np
import torch
import tvm_ffi


def cb(t):
    return t


tvm_ffi.register_global_func("capsan_test.cb", cb)
KEEP = [tvm_ffi.convert([torch.arange(5.0), torch.ones(3)]),
        tvm_ffi.convert({"w": torch.zeros(4)}), tvm_ffi.from_dlpack(torch.ones(2))]
lost = np.ones(9)  # <-- lost
ctypes.pythonapi.Py_IncRef(ctypes.py_object(lost))
del lost
print("done", len(KEEP), flush=True)
