"""A consumer that releases a tensor twice (dlpack-double-delete).

argv[1]: "legacy" (dltensor) or "versioned" (dltensor_versioned).
Natively the second deleter call is a real double free (glibc aborts);
under capsan protect=1 it is skipped and the program carries on.
"""
import sys

import dlconsumer as C
import dlproducer as P

if sys.argv[1:] == ["versioned"]:
    cap = P.versioned(8)  # <-- export-v
    total = C.double_delete_versioned(cap)  # <-- delete-v
else:
    cap = P.good(8)  # <-- export
    total = C.double_delete(cap)  # <-- delete
del cap
print("survived", total, P.deleted_count(), flush=True)
