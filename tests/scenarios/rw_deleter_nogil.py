"""A consumer that calls a numpy export's deleter with the GIL released (a
ctypes call releases it, as a C consumer inside Py_BEGIN_ALLOW_THREADS
does). numpy 1.22 and 1.23's deleter then calls PyMem_Free and Py_XDECREF
without the GIL (numpy #22507): PYTHONMALLOC=debug aborts; numpy 1.24 and
later take the GIL in their deleter. Prints "ok"."""
import ctypes

import numpy as np

api = ctypes.pythonapi
api.PyCapsule_GetPointer.restype = ctypes.c_void_p
api.PyCapsule_GetPointer.argtypes = [ctypes.py_object, ctypes.c_char_p]
api.PyCapsule_SetName.argtypes = [ctypes.py_object, ctypes.c_char_p]
# a CFUNCTYPE function is called with the GIL released
DELETER = ctypes.CFUNCTYPE(None, ctypes.c_void_p)
DELETER_OFFSET = 56  # DLManagedTensor.deleter

a = np.arange(1000, dtype=np.float32)
cap = a.__dlpack__()
mt = api.PyCapsule_GetPointer(cap, b"dltensor")
api.PyCapsule_SetName(cap, b"used_dltensor")  # consumed: the deleter is ours to call
deleter = DELETER(ctypes.c_void_p.from_address(mt + DELETER_OFFSET).value)
del a
deleter(mt)  # <-- nogil-delete
print("ok")
