"""A consumer written in pure ctypes, as DLPack's docs sketch one, that
sums a numpy export and releases it through its deleter, but never renames
the capsule to used_dltensor. When the capsule dies, numpy's destructor
still sees "dltensor" and deletes the tensor again, reading the deleter out
of a struct that is already freed (dlpack-not-renamed: a crash or a double
free natively)."""
import ctypes

import numpy as np


class DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int), ("device_id", ctypes.c_int)]


class DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class DLTensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("device", DLDevice), ("ndim", ctypes.c_int),
                ("dtype", DLDataType), ("shape", ctypes.POINTER(ctypes.c_int64)),
                ("strides", ctypes.POINTER(ctypes.c_int64)), ("byte_offset", ctypes.c_uint64)]


class DLManagedTensor(ctypes.Structure):
    pass


DELETER = ctypes.CFUNCTYPE(None, ctypes.POINTER(DLManagedTensor))
DLManagedTensor._fields_ = [("dl_tensor", DLTensor), ("manager_ctx", ctypes.c_void_p),
                            ("deleter", DELETER)]

api = ctypes.pythonapi
api.PyCapsule_GetPointer.restype = ctypes.c_void_p
api.PyCapsule_GetPointer.argtypes = [ctypes.py_object, ctypes.c_char_p]


def total(cap):
    ptr = api.PyCapsule_GetPointer(cap, b"dltensor")
    m = DLManagedTensor.from_address(ptr)
    n = m.dl_tensor.shape[0]
    vals = ctypes.cast(m.dl_tensor.data, ctypes.POINTER(ctypes.c_float))
    s = sum(vals[i] for i in range(n))
    m.deleter(ctypes.cast(ptr, ctypes.POINTER(DLManagedTensor)))  # <-- release
    return s  # BUG: the capsule still says "dltensor"


cap = np.arange(4, dtype=np.float32).__dlpack__()  # <-- export
print("total", total(cap), flush=True)
del cap  # <-- drop
print("survived", flush=True)
