"""A producer whose capsule destructor ignores the used_ name, under a real
consumer. np.from_dlpack renames the capsule and keeps the tensor inside
the array; the capsule dies at the end of that call, and its destructor
releases the tensor the array still holds (dlpack-unchecked-destructor).
When the array dies, numpy releases it again: the double delete that
finding caused, reported before it runs."""
import numpy as np

import dlproducer as P

arr = np.from_dlpack(P.Exporter(8, variant="unchecked"))  # <-- import
print("shape", arr.shape, flush=True)
del arr  # <-- drop
print("survived", flush=True)
