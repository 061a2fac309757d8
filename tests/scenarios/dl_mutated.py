"""The loaned metadata changes (R20), each side's way; the capsules are
otherwise correct and released once.
  producer  the producer halves the shape after the export: the consume
            sees other metadata than was exported
  consumer  the consumer writes into the producer's shape array: the
            deleter gets other metadata than was exported"""
import sys

import dlconsumer as C
import dlproducer as P

if sys.argv[1] == "producer":
    cap = P.loaned(8)  # <-- export
    P.shrink_loaned()  # the bug: shape 8 -> 4 after the export
    print("sum", C.consume_good(cap), flush=True)  # <-- consume
else:
    cap = P.good(8)  # <-- export-c
    print("sum", C.reshape_in_place(cap), flush=True)  # <-- reshape
del cap
print("deleted", P.deleted_count(), flush=True)
