"""Two ways a correct program's arrays stay alive past the interpreter's
end. A forward hook registered with torch keeps this module's globals
alive (the lambda's __globals__), so finalization never clears them and
the global array and the tensor torch consumed are never freed: held,
not leaked. An imported view at a
nonzero offset, kept in a global: numpy's deleter keeps its array alive
on purpose during shutdown, wherever in the block the view starts. A
reference the program really lost is still a leak, and so is a tensor a
buggy consumer took from the kept torch tensor: the producer's object
holding the same data does not hold the consumer's tensor."""
import ctypes

import numpy as np
import torch

torch.nn.modules.module.register_module_forward_hook(lambda *a: None)
a = np.ones(1000)
base = np.arange(100.0)
view = np.from_dlpack(base[1:])
tensor = torch.from_dlpack(np.arange(3.0))  # torch holds the consumed tensor, out of gc's sight
src = torch.arange(4.0)  # kept: its own data is held, not a tensor exported from it
api = ctypes.pythonapi
api.PyCapsule_GetPointer.restype = ctypes.c_void_p
api.PyCapsule_GetPointer.argtypes = [ctypes.py_object, ctypes.c_char_p]
api.PyCapsule_SetName.argtypes = [ctypes.py_object, ctypes.c_char_p]
api.PyCapsule_SetPointer.argtypes = [ctypes.py_object, ctypes.c_void_p]
cap = src.__dlpack__()  # <-- export-leak
api.PyCapsule_GetPointer(cap, b"dltensor")
api.PyCapsule_SetName(cap, b"used_dltensor")  # a consumer that never calls the deleter
api.PyCapsule_SetPointer(cap, 8)
del cap
lost = np.ones(9)  # <-- lost
ctypes.pythonapi.Py_IncRef(ctypes.py_object(lost))  # a reference lost, as a buggy extension does
del lost
print("done", flush=True)
