"""A consumer marks a numpy export consumed with a name of its own. numpy
1.22 to 2.0's capsule destructor then sees a name it does not expect and
calls PyErr_WriteUnraisable(capsule): that brings the dying capsule back
to life, it dies again inside the destructor, and the recursion ends in
SIGSEGV. numpy 2.1 and later report the unraisable and return. Prints "ok"
when it survives."""
import ctypes

import numpy as np

api = ctypes.pythonapi
api.PyCapsule_SetName.argtypes = [ctypes.py_object, ctypes.c_char_p]

a = np.arange(8, dtype=np.float32)
cap = a.__dlpack__()
api.PyCapsule_SetName(cap, b"dltensor_consumed")  # <-- renamed
del cap  # <-- dies
print("ok")
