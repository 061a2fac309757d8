"""W1: an allocation-heavy NumPy workload -- argv[1] array creations (default
1,000,000) of mixed sizes, with temporaries: every iteration creates five
arrays (empty, ones, the temporary of b*2, the sum, a strided copy) of one
of nine sizes from 1 to 5,000 elements, and frees them. Every creation is
a NumPy data allocation (and later a free) through the current handler.

Prints the loop's own time (import time is not what capsan is judged on)."""
import sys
import time

import loopmark  # bench/loopmark.py

import numpy as np

deep = len(sys.argv) > 1 and sys.argv[1] == "deep"
args = sys.argv[2:] if deep else sys.argv[1:]
n = int(args[0]) if args else 1_000_000
SIZES = (1, 3, 8, 64, 100, 257, 1000, 2000, 5000)
iters = n // 5


def at_depth(d):
    """`numpy_alloc.py deep N`: the same loop 50 Python frames deep, as a
    test under pytest runs (40 to 60): deeper than the 32 frames a stack
    keeps (in a function: its locals are fast, so its plain count is its own)"""
    if d:
        return at_depth(d - 1)
    loopmark.loop_starts()
    t = time.perf_counter(), time.process_time()
    for i in range(iters):
        k = SIZES[i % len(SIZES)]
        a = np.empty(k)
        b = np.ones(k)
        c = b * 2.0 + b
        d = c[::2].copy()
        del a, b, c, d
    t1 = time.perf_counter(), time.process_time()
    loopmark.loop_ends()
    return t, t1


if deep:
    (t0, c0), (t1, c1) = at_depth(50)
else:
    loopmark.loop_starts()  # callgrind counts from here (bench/icount.py)
    t0, c0 = time.perf_counter(), time.process_time()
    for i in range(iters):
        k = SIZES[i % len(SIZES)]
        a = np.empty(k)
        b = np.ones(k)
        c = b * 2.0 + b          # a temporary (b * 2.0), then the sum
        d = c[::2].copy()
        del a, b, c, d
    t1, c1 = time.perf_counter(), time.process_time()
    loopmark.loop_ends()
# wall and CPU seconds of the loop alone: on a shared VM the CPU time is
# the steadier of the two
print(t1 - t0, c1 - c0)
