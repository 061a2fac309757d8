"""A process that ends by a signal with arrays alive: abort() (a signal
sent, no fault address) or a NULL read (SIGSEGV, at address 0)."""
import ctypes
import os
import sys

import numpy as np

a = np.ones(10)
print("crashing", sys.argv[1], flush=True)
if sys.argv[1] == "abort":
    os.abort()
ctypes.string_at(0)
