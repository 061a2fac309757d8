"""A fork worker's end (os._exit) with 150 imported arrays still in use
(live-at-exit warnings) and one tensor a buggy consumer took and never
deleted (a dlpack-leak error): the error is what the exit status says, so
it is printed first, whatever max_findings leaves for the warnings."""
import ctypes
import os

import numpy as np

api = ctypes.pythonapi
api.PyCapsule_GetPointer.restype = ctypes.c_void_p
api.PyCapsule_GetPointer.argtypes = [ctypes.py_object, ctypes.c_char_p]
api.PyCapsule_SetName.argtypes = [ctypes.py_object, ctypes.c_char_p]
api.PyCapsule_SetPointer.argtypes = [ctypes.py_object, ctypes.c_void_p]
live = [np.from_dlpack(np.ones(1000)) for _ in range(150)]
cap = np.ones(3).__dlpack__()  # <-- leak
api.PyCapsule_GetPointer(cap, b"dltensor")
api.PyCapsule_SetName(cap, b"used_dltensor")  # consumed, and its deleter never called
api.PyCapsule_SetPointer(cap, 8)  # no copy of the pointer left behind
del cap
print("done", flush=True)
os._exit(0)
