"""Tests written as numpy's own test_numeric.py writes them, run by pytest
in a process that imports polars (as polars' suite does): arrays made at
collection as parametrize values, and a test class whose setup keeps its
arrays on self. pytest's items hold both to the end of the session, and
with polars loaded they outlive the interpreter's finalization (never
freed, even natively): still referenced from live Python objects, so not
leaked. The test that loses a reference to an array leaks it."""
import ctypes

import numpy as np
import polars  # noqa: F401  (what keeps pytest's session alive past finalization)
import pytest


@pytest.mark.parametrize("a", [np.arange(7.0), np.ones((3, 4)), np.zeros(5, dtype=np.int32)])
def test_param(a):
    assert a.size


class TestKept:
    def setup_method(self):
        self.x = np.linspace(0, 1, 11)
        self.y = np.arange(24).reshape(2, 3, 4)

    def test_one(self):
        assert self.x.shape == (11,)

    def test_two(self):
        assert self.y.sum() == 276


def test_lost():
    a = np.full(13, 2.0)  # <-- lost
    ctypes.pythonapi.Py_IncRef(ctypes.py_object(a))  # a reference lost, as a buggy extension does
