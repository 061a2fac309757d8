"""Tests written as nanoarrow's suite writes them: schema capsules made at
collection as @pytest.mark.parametrize values (from pyarrow and nanoarrow),
and a test class whose setup keeps an array capsule on self. pytest's
items hold them to the end of the session, past the interpreter's
finalization (never freed, even natively): still referenced from live
Python objects, so not leaked. The test that loses its reference to a
capsule leaks the struct in it."""
import ctypes

import nanoarrow as na
import pyarrow as pa
import pytest


@pytest.mark.parametrize("schema", [pa.int32().__arrow_c_schema__(),
                                    na.c_schema(na.int64()).__arrow_c_schema__(),
                                    pa.schema([pa.field("a", pa.utf8())]).__arrow_c_schema__()])
def test_schema(schema):
    assert na.c_schema(schema).format


class TestKept:
    def setup_method(self):
        self.arr = pa.array([1, 2, 3]).__arrow_c_array__()

    def test_kept(self):
        assert len(self.arr) == 2


def test_lost():
    cap = pa.int16().__arrow_c_schema__()  # <-- lost
    ctypes.pythonapi.Py_IncRef(ctypes.py_object(cap))  # a reference lost, as a buggy extension does
