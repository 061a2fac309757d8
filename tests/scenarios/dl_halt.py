"""Two independent bugs in a row: a reconsume, then a leak.
With halt_on_error=1 capsan stops the process at the first one."""
import dlconsumer as C
import dlproducer as P

cap = P.good(8)
C.consume_twice(cap)  # <-- first
print("after first", flush=True)
cap2 = P.good(8)
C.consume_leak(cap2)  # <-- second
print("after second", flush=True)
