"""A consumer written in pure ctypes, as DLPack's docs sketch one: it takes
the tensor out of numpy's capsule and marks the capsule used, but keeps the
DLManagedTensor in a cache and never calls its deleter. numpy's buffer
stays pinned for good: a dlpack-leak made at the consume line.

Runs unchanged on every CPython 3.10-3.13 and numpy 1.24 or 2."""
import ctypes

import numpy as np

api = ctypes.pythonapi
api.PyCapsule_GetPointer.restype = ctypes.c_void_p
api.PyCapsule_GetPointer.argtypes = [ctypes.py_object, ctypes.c_char_p]
api.PyCapsule_SetName.restype = ctypes.c_int
api.PyCapsule_SetName.argtypes = [ctypes.py_object, ctypes.c_char_p]

_cache = []  # what the consumer meant to release later


def consume(cap):
    ptr = api.PyCapsule_GetPointer(cap, b"dltensor")
    api.PyCapsule_SetName(cap, b"used_dltensor")  # <-- consume
    _cache.append(ptr)  # the pointer is kept, its deleter never called
    return ptr


def load(n):
    return consume(np.arange(n, dtype=np.float32).__dlpack__())


load(1000)
_cache.clear()  # forgets the tensor: nothing can release it now
