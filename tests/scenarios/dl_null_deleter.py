"""Tensors exported with deleter == NULL: legal (R10), as long as no
consumer calls it.

argv[1]:
  "checked": the consumer checks the deleter before calling it: no crash.
  "crash":   the consumer calls mt->deleter(mt) unconditionally: SIGSEGV
             (dlpack-null-deleter).
  "static":  a module lends one static table again and again; every export
             is a new loan, consumed once: clean.
"""
import sys

import dlconsumer as C
import dlproducer as P

if sys.argv[1] == "static":
    total = 0.0
    for _ in range(3):
        total += C.consume_good(P.constants())  # <-- lend
    print("total", total, flush=True)
    sys.exit(0)
cap = P.null_deleter(8)  # <-- export
if sys.argv[1] == "crash":
    print("calling", flush=True)
    C.call_null_deleter(cap)  # <-- call
    print("not reached", flush=True)
else:
    C.consume_good(cap)  # <-- consume
del cap
print("survived", flush=True)
