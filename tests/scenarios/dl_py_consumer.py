"""A consumer written in Python, the way warp's from_dlpack is: it reads
the DLTensor through ctypes, makes an array object of its own (one with
__array_interface__), and renames the capsule through ctypes. The
producer (dlproducer.offset) puts 0..7 at data + 16 and -1.0 in the four
float32 slots before.

argv[1]:
  "bug":  the array starts at data (byte_offset ignored): it sums 2.0
          (dlpack-byte-offset-ignored at the consume)
  "good": the array starts at data + byte_offset: it sums 28.0, clean
"""
import ctypes
import sys

import dlproducer as P

api = ctypes.pythonapi
api.PyCapsule_GetPointer.restype = ctypes.c_void_p
api.PyCapsule_GetPointer.argtypes = [ctypes.py_object, ctypes.c_char_p]
api.PyCapsule_SetName.restype = ctypes.c_int
api.PyCapsule_SetName.argtypes = [ctypes.py_object, ctypes.c_char_p]


class DLTensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("device", ctypes.c_int32 * 2),
                ("ndim", ctypes.c_int32), ("dtype", ctypes.c_uint8 * 4),
                ("shape", ctypes.POINTER(ctypes.c_int64)), ("strides", ctypes.c_void_p),
                ("byte_offset", ctypes.c_uint64)]


class DLManagedTensor(ctypes.Structure):
    _fields_ = [("dl_tensor", DLTensor), ("manager_ctx", ctypes.c_void_p),
                ("deleter", ctypes.CFUNCTYPE(None, ctypes.c_void_p))]


class Array:
    """A float32 vector over foreign memory, described the NumPy way"""

    def __init__(self, ptr, n, mt):
        self.ptr, self.n, self.mt = ptr, n, mt
        self.__array_interface__ = {"data": (ptr, False), "shape": (n,), "typestr": "<f4",
                                    "version": 3}

    def sum(self):
        return float(sum((ctypes.c_float * self.n).from_address(self.ptr)))

    def release(self):
        """the owner's part: the deleter, once"""
        DLManagedTensor.from_address(self.mt).deleter(self.mt)


def from_dlpack(capsule, honor):
    mt = api.PyCapsule_GetPointer(capsule, b"dltensor")
    t = DLTensor.from_address(mt)
    arr = Array(t.data + (t.byte_offset if honor else 0), t.shape[0], mt)
    api.PyCapsule_SetName(capsule, b"used_dltensor")
    return arr


a = from_dlpack(P.offset(8), sys.argv[1] == "good")  # <-- consume
print("sum", a.sum(), flush=True)
a.release()
