"""W6: DLPack and Arrow exchanges on THREADS threads at once, for the
free-threaded build (issue 43): each thread makes a NumPy array and hands
it to numpy by DLPack, hands a pyarrow array to numpy by DLPack, and every
fourth round passes a pyarrow table through __arrow_c_stream__. Each
thread does N rounds: the work grows with the threads, and with the GIL
off and free cores the loop's wall time would not.

    ft_threads.py THREADS N

Prints the loop's own wall and CPU seconds, from the moment every thread
is ready to the last one's end (bench/run.py's ft_scaling compares them
plain and under capsan at 1, 2 and 8 threads)."""
import sys
import threading
import time

import numpy as np
import pyarrow as pa

import loopmark  # bench/loopmark.py

threads = int(sys.argv[1]) if len(sys.argv) > 1 else 1
n = int(sys.argv[2]) if len(sys.argv) > 2 else 20000
go = threading.Barrier(threads + 1)


class Stream:
    """Only the stream dunder: the capsule path, not pyarrow's shortcut."""

    def __init__(self, o):
        self.o = o

    def __arrow_c_stream__(self, requested_schema=None):
        return self.o.__arrow_c_stream__(requested_schema)


def work(k):
    parr = pa.array(np.arange(16, dtype=np.float64) + k)
    table = pa.table({"a": pa.array(range(8), pa.int64())})
    go.wait()
    s = 0.0
    for i in range(n):
        a = np.arange(16, dtype=np.int64)
        s += np.from_dlpack(a)[1]            # numpy -> numpy
        s += np.from_dlpack(parr)[1]         # pyarrow -> numpy
        if i % 4 == 0:
            s += pa.table(Stream(table)).num_rows  # pyarrow -> pyarrow by stream capsule
    assert s > 0


ts = [threading.Thread(target=work, args=(k,)) for k in range(threads)]
for t in ts:
    t.start()
loopmark.loop_starts()  # callgrind counts every thread from here (bench/icount.py)
go.wait()
t0, c0 = time.perf_counter(), time.process_time()
for t in ts:
    t.join()
t1, c1 = time.perf_counter(), time.process_time()
loopmark.loop_ends()
gil = sys._is_gil_enabled() if hasattr(sys, "_is_gil_enabled") else True
print(f"gil={gil}", file=sys.stderr)
print(t1 - t0, c1 - c0)
