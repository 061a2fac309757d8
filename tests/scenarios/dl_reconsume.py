"""A consumer that consumes an already consumed capsule (dlpack-reconsume):
it renames to used_dltensor, then takes the pointer again with
PyCapsule_GetPointer(cap, "used_dltensor") and reads the tensor again."""
import dlconsumer as C
import dlproducer as P

cap = P.good(8)  # <-- export
first, second = C.consume_twice(cap)  # <-- reconsume
del cap
print("sums", first, second, "deleted", P.deleted_count(), flush=True)
