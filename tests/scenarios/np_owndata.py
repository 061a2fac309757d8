"""Memory numpy never allocated, owned by an array (numpy-foreign-free), and
a block numpy frees twice (numpy-double-free), from the np_foreign extension.

argv[1]:
  offset16  OWNDATA on malloc'd memory + 16: numpy's free() is a real invalid
            free (glibc aborts); capsan reports before the abort
  exact     OWNDATA on a malloc'd block: numpy's free() succeeds, the bug is
            silent without capsan (numpy's own test_switch_owner does this)
  capsule   the fix: a PyCapsule base owns the block (clean)
  double    PyDataMem_FREE() on an array's data, OWNDATA kept: numpy frees the
            1024-byte block again (glibc aborts: double free in tcache)
argv[2]: "trace" to run the bug inside capsan.trace() and print its findings.
"""
import sys

import numpy as np

import np_foreign as O

mode = sys.argv[1]
traced = len(sys.argv) > 2 and sys.argv[2] == "trace"
from np_common import run_mode  # noqa: E402


def offset16():
    a = O.offset16(100)  # <-- create-offset16
    assert a[99] == 99.0
    del a  # <-- free-offset16


def exact():
    a = O.exact(100)  # <-- create-exact
    assert a.flags.owndata and a[99] == 99.0
    del a  # <-- free-exact


def capsule():
    a = O.capsule_base(100)
    assert not a.flags.owndata and a.sum() == 4950.0
    b = a[10:20]
    del a
    assert b[0] == 10.0
    del b
    assert O.freed() == 1


def double():
    a = np.arange(128, dtype=np.float64)  # <-- alloc-double
    O.free_twice(a)  # <-- free-first
    del a  # <-- free-again


run_mode({"offset16": offset16, "exact": exact, "capsule": capsule, "double": double}, mode, traced)
