"""A consumer that re-exports what it consumed (dlbridge): a zero-copy
bridge whose array type has no offset keeps dl_tensor.data as the start
and drops byte_offset, so the tensor it hands on describes the same buffer
starting byte_offset bytes early (dlpack-byte-offset-ignored). The producer
(dlproducer.offset) puts 0..n-1 at data + 16 and -1.0 in the four float32
slots before: the bridge's reader sums the wrong elements.

argv[1]: "bug" (bridge) or "good" (bridge_good, data + byte_offset).
"""
import sys

import dlbridge as B
import dlconsumer as C
import dlproducer as P

src = P.offset(8)  # <-- export
if sys.argv[1] == "bug":
    out = B.bridge(src)  # <-- bridge
else:
    out = B.bridge_good(src)  # <-- bridge-good
print("sum", C.consume_good(out), flush=True)
