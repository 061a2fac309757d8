"""Two ways a correct program's arrays stay alive past the interpreter's
end. A forward hook registered with torch keeps this module's globals
alive (the lambda's __globals__), so finalization never clears them and
the global array and the tensor torch consumed are never freed: held,
not leaked. An imported view at a
nonzero offset, kept in a global: numpy's deleter keeps its array alive
on purpose during shutdown, wherever in the block the view starts. A
reference the program really lost is still a leak."""
import ctypes

import numpy as np
import torch

torch.nn.modules.module.register_module_forward_hook(lambda *a: None)
a = np.ones(1000)
base = np.arange(100.0)
view = np.from_dlpack(base[1:])
tensor = torch.from_dlpack(np.arange(3.0))  # torch holds the consumed tensor, out of gc's sight
lost = np.ones(9)  # <-- lost
ctypes.pythonapi.Py_IncRef(ctypes.py_object(lost))  # a reference lost, as a buggy extension does
del lost
print("done", flush=True)
