"""Leaked NumPy arrays (numpy-leak), committed by the np_leaky extension.

argv[1]:
  keep      under capsan.trace(): an array handed to keep_forever() (INCREF'd
            and stored in C)
  refcount  under capsan.trace(): an array created in C with one reference
            too many
  released  under capsan.trace(): keep_forever(), then release() (the fix): clean
  exit      no trace: keep_forever() at module level, the run ends
            (capsan run reports it at exit)
"""
import sys

import numpy as np

import capsan
import np_leaky as L
from np_common import emit

mode = sys.argv[1]


def keep():
    a = np.ones(1000)  # <-- alloc-keep
    L.keep_forever(a)


def refcount():
    b = L.new_leaked(500)  # <-- alloc-refcount
    assert b.sum() == 500


def released():
    a = np.ones(1000)
    L.keep_forever(a)
    del a
    L.release()


if mode == "exit":
    c = np.full(300, 7.0)  # <-- alloc-exit
    L.keep_forever(c)
    del c
    print("kept", L.kept())
else:
    with capsan.trace() as t:
        {"keep": keep, "refcount": refcount, "released": released}[mode]()
    emit(t)
    print("kept", L.kept())
