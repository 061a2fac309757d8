"""Tensors that are never released (dlpack-leak).

argv[1]:
  "consumed":      a consumer renames the capsule and never calls the deleter
  "no_destructor": a producer makes a capsule without a destructor; it dies unconsumed
  "numpy":         the consumer takes a numpy array's export and never calls the
                   deleter: the tensor leaks, and the array its manager_ctx holds
argv[2] (optional): exit with this status (sys.exit) instead of 0.
"""
import sys

import dlconsumer as C
import dlproducer as P

if sys.argv[1] == "consumed":
    cap = P.good(8)  # <-- export
    C.consume_leak(cap)  # <-- consume
    del cap
elif sys.argv[1] == "numpy":
    import numpy as np
    frame = np.arange(8, dtype=np.float32)  # <-- alloc-np
    C.consume_leak(frame.__dlpack__())  # <-- consume-np
    del frame
else:
    cap2 = P.no_destructor(8)  # <-- export-nodtor
    del cap2  # <-- destroy-nodtor
print("deleted", P.deleted_count(), flush=True)
if len(sys.argv) > 2:
    sys.exit(int(sys.argv[2]))
