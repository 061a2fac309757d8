"""A fork-started multiprocessing worker keeps Arrow capsules and a
nanoarrow stream in a module-level registry. multiprocessing ends such a
worker with os._exit(), which runs no cleanup: what it still holds is
live, not leaked, and its exit code (what the parent sees) stays 0."""
import multiprocessing as mp

import nanoarrow as na
import pyarrow as pa

READERS = []


def worker():
    s = na.c_array_stream(pa.table({"a": [1, 2, 3]}))
    READERS.append(s)  # <-- stream
    print("child read", s.get_next().length, flush=True)
    READERS.append(pa.array([1, 2]).__arrow_c_array__())  # <-- capsules


if __name__ == "__main__":
    p = mp.get_context("fork").Process(target=worker)
    p.start()
    p.join()
    print("child exitcode", p.exitcode, flush=True)
