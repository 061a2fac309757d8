"""W4: the Arrow PyCapsule interface between real libraries.

    arrow_exchange.py stream N     a pyarrow RecordBatchReader of N small
                                   batches (a Python generator) scanned by
                                   duckdb: N get_next calls, N chunks
                                   followed and released
    arrow_exchange.py roundtrip N  N polars -> pyarrow -> polars round trips
                                   of a small frame, each through
                                   __arrow_c_stream__ capsules

Needs the Arrow venv (.ci/arrowvenvs, make arrow-venvs): without pyarrow,
polars or duckdb it prints why on stderr and exits with status 77 (a
skip). Prints the loop's own wall and CPU seconds, like the other
workloads."""
import sys
import time

import loopmark  # bench/loopmark.py

SKIP = 77
try:
    import duckdb
    import polars as pl
    import pyarrow as pa
except ImportError as e:
    print(f"W4 skipped: {e} in {sys.executable} (the Arrow venv, make arrow-venvs)",
          file=sys.stderr)
    sys.exit(SKIP)


class Stream:
    """Only the stream dunder: no library takes the legacy integer path."""

    def __init__(self, o):
        self.o = o

    def __arrow_c_stream__(self, requested_schema=None):
        return self.o.__arrow_c_stream__(requested_schema)


what = sys.argv[1] if len(sys.argv) > 1 else "stream"
n = int(sys.argv[2]) if len(sys.argv) > 2 else (20_000 if what == "stream" else 100_000)
schema = pa.schema([("a", pa.int64())])
batch = pa.record_batch({"a": pa.array(range(8), pa.int64())})
# one duckdb thread: the stream is scanned on the main thread in every
# run. With a pool, which thread calls get_next depends on scheduling
# (callgrind serializes threads): a worker thread has no Python thread
# state, so pyarrow's PyGILState_Ensure makes and frees one per batch,
# about 600 instructions a batch that came and went between runs.
# Threaded scans are tested for findings (test_arrow_peers.py, threads=4).
con = duckdb.connect(config={"threads": 1})
df = pl.DataFrame({"a": list(range(8))})


def batches(k):
    for _ in range(k):
        yield batch


if what == "stream":
    reader = pa.RecordBatchReader.from_batches(schema, batches(1))
    con.execute("select sum(a) from reader").fetchall()  # once before the loop
    reader = pa.RecordBatchReader.from_batches(schema, batches(n))
    loopmark.loop_starts()
    t0, c0 = time.perf_counter(), time.process_time()
    got = con.execute("select sum(a) from reader").fetchall()[0][0]
    t1, c1 = time.perf_counter(), time.process_time()
    loopmark.loop_ends()
    assert got == 28 * n, got
else:
    pl.DataFrame(Stream(pa.table(Stream(df))))  # once before the loop
    loopmark.loop_starts()
    t0, c0 = time.perf_counter(), time.process_time()
    for _ in range(n):
        back = pl.DataFrame(Stream(pa.table(Stream(df))))
    t1, c1 = time.perf_counter(), time.process_time()
    loopmark.loop_ends()
    assert back.height == 8
print(t1 - t0, c1 - c0)
