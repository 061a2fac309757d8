"""A consumer that takes a released tensor again (dlpack-reconsume): it
renames to used_dltensor, reads, releases, then takes the pointer again
with PyCapsule_GetPointer(cap, "used_dltensor")."""
import dlconsumer as C
import dlproducer as P

cap = P.good(8)  # <-- export
first, second = C.consume_twice(cap)  # <-- reconsume
del cap
print("sums", first, second, "deleted", P.deleted_count(), flush=True)
