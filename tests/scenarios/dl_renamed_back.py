"""A capsule renamed back to "dltensor" after its tensor was consumed and
released, then consumed again (dlpack-reconsume): the second consumer reads
a released DLManagedTensor through a capsule that claims to be unused. Its
deleter then runs a second time (dlpack-double-delete; protect=1 skips
it). The read of the released struct is a use after free: depending on
the heap it returns garbage or faults, after capsan has reported it."""
import ctypes

import dlconsumer as C
import dlproducer as P

set_name = ctypes.pythonapi.PyCapsule_SetName
set_name.argtypes = [ctypes.py_object, ctypes.c_char_p]

cap = P.good(8)
first = C.consume_good(cap)  # renamed to used_dltensor, read, released
set_name(cap, b"dltensor")  # the bug: it says unconsumed again
second = C.consume_good(cap)  # <-- reconsume
print("consumed twice", first, flush=True)
