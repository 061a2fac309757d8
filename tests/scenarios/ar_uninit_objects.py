"""pyarrow objects made with __new__ and never initialized (their C++
object is NULL: most getters crash) kept in globals at exit, beside a
live NumPy array: capsan's exit walk asks only whole pyarrow objects for
their buffers, so the program ends as it does without capsan."""
import numpy as np
import pyarrow as pa

a = np.ones(3)
objs = [cls.__new__(cls) for cls in (pa.Array, pa.Int64Array, pa.Table, pa.RecordBatch,
                                     pa.ChunkedArray)]
print("end", len(objs), flush=True)
