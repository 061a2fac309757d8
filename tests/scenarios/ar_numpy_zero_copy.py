"""The everyday pandas -> pyarrow -> parquet script: pa.Table.from_pandas
and pa.array wrap the arrays' memory without a copy, and the program keeps
the results in globals to its end. pyarrow lets go of those buffers at
shutdown without releasing the arrays, so the blocks outlive the process:
held, not leaked. A reference the program really lost is still a leak."""
import ctypes
import os
import tempfile

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

df = pd.DataFrame({"a": np.arange(10000), "b": np.random.rand(10000)})
table = pa.Table.from_pandas(df)
col = pa.array(np.arange(3, dtype=np.int8))  # zero-copy around a temporary array
chunked_table = pa.table({"c": pa.chunked_array([pa.array(np.ones(5))])})
with tempfile.TemporaryDirectory() as d:
    pq.write_table(table, os.path.join(d, "t.parquet"))
lost = np.ones(9)  # <-- lost
ctypes.pythonapi.Py_IncRef(ctypes.py_object(lost))  # a reference lost, as a buggy extension does
del lost
print("rows", table.num_rows, col.to_pylist(), flush=True)
