"""The issue's new-user story: polars imports an arrow_array capsule that
was already consumed and returns an empty Series with no error
(rulebook-seams 1.2). capsan names both consumers."""
import sys

import polars as pl
import pyarrow as pa

caps = pa.array(range(1000), pa.int64()).__arrow_c_array__()  # <-- export


class Holder:
    """A producer that hands out the same capsules every time."""

    def __arrow_c_array__(self, requested_schema=None):
        return caps


first = pl.Series(Holder())  # <-- first
second = pl.Series(Holder())  # <-- again
print(len(first), len(second), file=sys.stderr)
