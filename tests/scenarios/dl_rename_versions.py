"""Consumed names across DLPack versions (R8), both ways round:

  consumer   a consumer written for DLPack 0.x renames a versioned capsule
             "used_dltensor": the producer's destructor rightly sees no
             consumed capsule and releases the tensor; the consumer's own
             release is the second. The consumer is at fault.
  producer   a consumer renames correctly ("used_dltensor_versioned"); the
             producer's destructor knows only "used_dltensor" and releases
             the consumed tensor again. The producer is at fault.
Run with protect=1 (the second release is skipped). Prints "ok"."""
import sys

import dlconsumer as C
import dlproducer as P

if sys.argv[1] == "consumer":
    cap = P.versioned(8, dtor="v1_used")
    C.consume_versioned_old_name(cap)  # <-- old-name
    del cap  # <-- dies
    C.release_held()  # <-- second-release
elif sys.argv[1] == "producer":
    cap = P.versioned(8, dtor="v0_used")
    C.consume_versioned_good(cap)  # <-- consumed
    del cap  # <-- producer-deletes
print("ok", P.deleted_count())
