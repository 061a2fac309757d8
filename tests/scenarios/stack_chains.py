"""The same leaks reached through several Python and native paths, many
times each, so that capsan's native chain cache (fast_unwind) both hits and
misses, and the Python stacks it remembers per chain are replaced and
proven again: numpy arrays kept forever by np_leaky, and numpy capsules
consumed by dlconsumer and never released. Run with fast_unwind=1 and =0, the
reports must name the same stacks."""
import numpy as np

import dlconsumer as C
import np_leaky as L


def direct(n):
    L.keep_forever(np.ones(n))  # <-- keep-direct


def through_map(n):
    list(map(L.keep_forever, [np.zeros(n)]))  # <-- keep-map


def via_sort(n):
    a = np.arange(n)[::-1]
    L.keep_forever(np.sort(a))  # <-- keep-sort


def consume(n):
    C.consume_leak(np.arange(n, dtype=np.float32).__dlpack__())  # <-- consume


def rotate(n):
    # one native chain (np.ones' allocation) from three lines of one
    # function in turn: more stacks than a chain remembers (two)
    k = n % 3
    if k == 0:
        L.keep_forever(np.ones(n))  # <-- rot-0
    elif k == 1:
        L.keep_forever(np.ones(n))  # <-- rot-1
    else:
        L.keep_forever(np.ones(n))  # <-- rot-2


def nested(f, depth, n):
    return f(n) if depth == 0 else nested(f, depth - 1, n)


for i in range(40):
    for f in (direct, through_map, via_sort, consume, rotate):
        nested(f, i % 3, 8 + i % 5)
        rotate(i)
print("done")
