"""A clean program that only prints: used by the option tests."""
import dlconsumer as C
import dlproducer as P

print("program ran", C.consume_good(P.good(4)), flush=True)
