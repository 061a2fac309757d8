"""A consumer that calls the deleter but leaves the capsule named "dltensor"
(dlpack-not-renamed). The producer's (correct) destructor then releases the
tensor again: a real double free natively, skipped by capsan with protect=1."""
import dlconsumer as C
import dlproducer as P

cap = P.good(8)  # <-- export
C.delete_no_rename(cap)  # <-- delete
del cap  # <-- destroy
print("survived", P.deleted_count(), flush=True)
