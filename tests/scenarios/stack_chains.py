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


def runs(i):
    # one line three times in a row (the memo is then proven from the raw
    # frames), then the other line of the same function, on the same chain
    for j in range(6):
        if j < 3:
            L.keep_forever(np.ones(8))  # <-- run-a
        else:
            L.keep_forever(np.ones(8))  # <-- run-b


def nested(f, depth, n):
    return f(n) if depth == 0 else nested(f, depth - 1, n)


for i in range(40):
    for f in (direct, through_map, via_sort, consume, rotate):
        nested(f, i % 3, 8 + i % 5)
        rotate(i)
    # deeper than the 32 Python frames a stack keeps, and around it: the
    # memo of a deep stack, whole or cut at python_depth
    nested(direct, 28 + i % 8, 8)
    nested(rotate, 30 + i % 4, i)
    runs(i)
    nested(runs, 33, i)
print("done")
