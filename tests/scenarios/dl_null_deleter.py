"""A tensor exported with deleter == NULL (dlpack-null-deleter, a warning).

argv[1]:
  "checked": the consumer checks the deleter before calling it: no crash.
  "crash":   the consumer calls mt->deleter(mt) unconditionally: SIGSEGV.
"""
import sys

import dlconsumer as C
import dlproducer as P

cap = P.null_deleter(8)  # <-- export
if sys.argv[1] == "crash":
    print("calling", flush=True)
    C.call_null_deleter(cap)  # <-- call
    print("not reached", flush=True)
else:
    C.consume_good(cap)  # <-- consume
del cap
print("survived", flush=True)
