"""A producer's capsule destructor that clears the error indicator (R5):
a strict consumer refuses the tensor with TypeError and drops the capsule
with the error set; the destructor (dlproducer.clobbering) asks for the
unconsumed name, gets an error, and clears it with the TypeError: the call
then fails with SystemError. With argv[1] == "good" the producer leaves
the error alone and the TypeError arrives."""
import sys

import dlconsumer as C
import dlproducer as P

variant = sys.argv[1] if len(sys.argv) > 1 else "clobbering"
try:
    C.strict_float64(P.Exporter(8, variant=variant))  # <-- refused
    print("no exception")
except TypeError:
    print("TypeError")
except SystemError:
    print("SystemError")
