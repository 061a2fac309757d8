"""Correct traffic on the newest CPythons, with what their wheels offer:
numpy <-> numpy DLPack round trips (versioned and legacy capsules, views,
0-d and empty arrays), THREADS threads exchanging arrays and handing some
to each other to drop, a fork whose child exchanges too, and, where
pyarrow and polars are installed, Arrow data both ways between them and
numpy through the PyCapsule interface. capsan must report nothing.

argv[1]: rounds per thread (default 300); argv[2]: threads (default 4).
On a free-threaded build the threads really run at once (the fixtures
and numpy declare they need no GIL)."""
import os
import sys
import threading

import numpy as np

ROUNDS = int(sys.argv[1]) if len(sys.argv) > 1 else 300
THREADS = int(sys.argv[2]) if len(sys.argv) > 2 else 4

try:
    import pyarrow as pa
except ImportError:
    pa = None
try:
    import polars as pl
except ImportError:
    pl = None

errors = []
shared = []
lock = threading.Lock()


def dlpack_round(k, i):
    a = np.arange(16, dtype=np.int64) + k * 1_000_000 + i
    b = np.from_dlpack(a)                       # versioned, shared memory
    c = np.from_dlpack(a[::2])                  # a strided view
    d = np.from_dlpack(np.asarray(a.sum()))     # 0-d
    e = np.from_dlpack(np.zeros((3, 0)))        # empty
    if int(b[0]) != k * 1_000_000 + i or int(c[1]) != int(a[2]) or d.shape != () or e.size:
        errors.append(("dlpack", k, i))
    return b


def arrow_round(k, i):
    n = 8 + i % 5
    t = pa.table({"x": pa.array(np.arange(n, dtype=np.int64) + k), "y": [str(j) for j in range(n)]})
    back = pa.table(t)                             # __arrow_c_stream__ round trip
    arr = pa.array(pa.array(np.ones(n)))            # __arrow_c_array__
    if back.num_rows != n or arr.to_numpy().sum() != n:
        errors.append(("arrow", k, i))
    if pl is not None:
        df = pl.DataFrame(t)                       # pyarrow -> polars by capsule
        again = pa.table(df)                       # polars -> pyarrow by capsule
        if again.column("x").to_pylist() != t.column("x").to_pylist():
            errors.append(("polars", k, i))
        s = pl.Series(np.arange(n))                # numpy -> polars
        if int(s.to_numpy().sum()) != n * (n - 1) // 2:
            errors.append(("series", k, i))


def worker(k):
    try:
        for i in range(ROUNDS):
            b = dlpack_round(k, i)
            if pa is not None and i % 10 == 0:
                arrow_round(k, i)
            if i % 37 == 0:
                with lock:  # another thread drops it
                    shared.append(b)
                    if len(shared) > 8:
                        shared.pop(0)
    except Exception as e:  # noqa: BLE001
        errors.append(repr(e))


threads = [threading.Thread(target=worker, args=(k,)) for k in range(THREADS)]
for t in threads:
    t.start()
for t in threads:
    t.join()

pid = os.fork()
if pid == 0:
    ok = int(np.from_dlpack(np.arange(5)).sum()) == 10
    if pa is not None:
        ok = ok and pa.table({"a": [1, 2, 3]}).num_rows == 3
    os._exit(0 if ok else 3)
_, status = os.waitpid(pid, 0)
if os.waitstatus_to_exitcode(status) != 0:
    errors.append(("child", status))
shared.clear()
gil = sys._is_gil_enabled() if hasattr(sys, "_is_gil_enabled") else True
print(f"clean exchanges: {THREADS} threads x {ROUNDS} rounds, arrow={pa is not None}, "
      f"polars={pl is not None}, gil={gil}, errors={errors}")
sys.exit(1 if errors else 0)
