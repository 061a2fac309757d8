"""Tests that keep pyarrow objects made around NumPy arrays in a module
global: pyarrow's buffer holds each array, out of gc's sight, and the
tests pass; the one that loses a reference to an array fails at its line."""
import ctypes

import numpy as np
import pandas as pd
import pyarrow as pa

KEEP = []


def test_pyarrow_zero_copy_in_global():
    KEEP.append(pa.array(np.arange(5)))


def test_table_from_pandas_in_global():
    KEEP.append(pa.Table.from_pandas(pd.DataFrame({"a": np.arange(100.0)})))


def test_chunked_in_table_in_global():
    KEEP.append(pa.table({"c": pa.chunked_array([pa.array(np.ones(4)), pa.array(np.zeros(3))])}))


def test_lost():
    ctypes.pythonapi.Py_IncRef(ctypes.py_object(np.ones(3)))  # <-- lost
