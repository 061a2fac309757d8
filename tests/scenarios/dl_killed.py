"""A double delete (survived thanks to protect=1), then the process waits to be
SIGKILLed: its trace must still replay with the finding."""
import time

import dlconsumer as C
import dlproducer as P

cap = P.good(8)  # <-- export
C.double_delete(cap)  # <-- delete
print("ready", flush=True)
time.sleep(60)
print("not killed", flush=True)
