"""describe() of an object that speaks DLPack and Arrow (a pyarrow Array):
the DLPack view says the Arrow one exists and how to ask for it."""
import sys

import pyarrow as pa

import capsan

a = pa.array([1, 2, 3])
print(capsan.describe(a), file=sys.stderr)
print(capsan.describe(a, arrow=True), file=sys.stderr)
print(capsan.describe(a, arrow=False), file=sys.stderr)
