"""A producer whose capsule destructor ignores the capsule's name
(dlpack-unchecked-destructor): it releases a tensor a consumer already owns.

argv[1]:
  "consume_leak": the consumer renames and keeps the tensor; the destructor
                  releases it behind its back (one deleter call: no crash).
  "consume_good": the consumer renames and releases; the destructor releases
                  again (a real double free natively; skipped with protect=1).
"""
import sys

import dlconsumer as C
import dlproducer as P

cap = P.unchecked(8)  # <-- export
if sys.argv[1] == "consume_leak":
    C.consume_leak(cap)  # <-- consume-leak
else:
    C.consume_good(cap)  # <-- consume-good
del cap  # <-- destroy
print("survived", P.deleted_count(), flush=True)
