"""Correct traffic under true parallelism (issue 43): THREADS threads
exchange DLPack tensors and Arrow streams among numpy and pyarrow for
SECONDS, and hand half of what they make to another thread, which
consumes or drops it there. On a free-threaded build with the GIL off
every capsan table, the tracing of NumPy's blocks and the trace writer
are used by all threads at once. capsan must report nothing.

    ft_stress.py SECONDS [THREADS]

Each round of a thread: numpy -> numpy DLPack (versioned, a strided view,
0-d, empty), pyarrow -> numpy DLPack, a pyarrow table through
__arrow_c_stream__ and an array through __arrow_c_array__, a capsule of
each kind made here and consumed by the next thread (or dropped
unconsumed there, one in four: the capsule's destructor releases it), and
NumPy temporaries. Under capsan, one round in SCOPE_EVERY is a NumPy round
inside a capsan.trace() scope of its own: each thread installs and
removes its tracing handler while the others allocate through theirs,
and a scope must find nothing. After the workers end, a fork whose child exchanges
once (a fork while they run hangs the child natively: pyarrow's and the
interpreter's state after fork() in a threaded process, no capsan needed).

A hang is a failure too: faulthandler dumps every thread's stack
("Timeout (0:...)!" on stderr) and exits with status 1 once the run
overstays SECONDS by a wide margin. The
last line says what ran and whether the GIL stayed off."""
import faulthandler
import warnings
import os
import sys
import threading
import time
from collections import deque

import numpy as np
import pyarrow as pa

SECONDS = float(sys.argv[1]) if len(sys.argv) > 1 else 5.0
THREADS = int(sys.argv[2]) if len(sys.argv) > 2 else 8

# a deadlock (capsan's locks or anyone's) ends the run with every stack
faulthandler.dump_traceback_later(SECONDS * 3 + 60, exit=True)

SCOPE_EVERY = 100  # each scope may gc.collect(), which stops every thread
# the scopes only where capsan already runs (capsan run): a plain run
# must not start it by importing the package
if "libcapsan.so" in os.environ.get("LD_PRELOAD", ""):
    import capsan
else:
    capsan = None

errors = []
rounds = [0] * THREADS
handed = [0] * THREADS
inbox = [deque() for _ in range(THREADS)]  # deque: append/popleft are atomic
stop = threading.Event()


class Capsule:
    """An object whose dunder hands out a capsule made elsewhere (on
    another thread): the consumer takes what the producer made."""

    def __init__(self, cap, device=None):
        self.cap, self.device = cap, device

    def __dlpack__(self, stream=None, max_version=None, dl_device=None, copy=None):
        cap, self.cap = self.cap, None
        return cap

    def __dlpack_device__(self):
        return self.device

    def __arrow_c_stream__(self, requested_schema=None):
        cap, self.cap = self.cap, None
        return cap


def check(ok, what, k, i):
    if not ok:
        errors.append((what, k, i))


def dlpack_round(k, i):
    a = np.arange(16, dtype=np.int64) + k * 1_000_000 + i
    b = np.from_dlpack(a)                       # versioned, shared memory
    c = np.from_dlpack(a[::2])                  # a strided view
    d = np.from_dlpack(np.asarray(a.sum()))     # 0-d
    e = np.from_dlpack(np.zeros((3, 0)))        # empty
    check(int(b[0]) == k * 1_000_000 + i and int(c[1]) == int(a[2]) and d.shape == ()
          and not e.size, "dlpack", k, i)
    p = pa.array(np.arange(8, dtype=np.float64) + i)
    q = np.from_dlpack(p)                       # pyarrow -> numpy
    check(float(q[1]) == i + 1.0, "pa-dlpack", k, i)
    return b


def arrow_round(k, i):
    n = 8 + i % 5
    t = pa.table({"x": pa.array(np.arange(n, dtype=np.int64) + k), "y": [str(j) for j in range(n)]})
    back = pa.table(t)                                        # __arrow_c_stream__
    arr = pa.array(pa.array(np.ones(n)))                      # __arrow_c_array__
    check(back.num_rows == n and arr.to_numpy().sum() == n, "arrow", k, i)
    r = pa.RecordBatchReader.from_batches(t.schema, t.to_batches())
    got = pa.RecordBatchReader.from_stream(r).read_all()      # a reader's stream
    check(got.column("x").to_pylist() == t.column("x").to_pylist(), "stream", k, i)
    return t


def hand_over(k, i, a, t):
    """capsules made here, for the next thread to consume or drop"""
    to = inbox[(k + 1) % THREADS]
    if len(to) < 64:
        to.append(("dl", i, a.__dlpack__(max_version=(1, 0)), a.__dlpack_device__(), a))
        to.append(("arrow", i, t.__arrow_c_stream__(), None, t))
        handed[k] += 2


def take_over(k):
    """consume what the previous thread made (one in four dropped as is)"""
    box = inbox[k]
    while box:
        try:
            kind, i, cap, dev, src = box.popleft()
        except IndexError:
            return
        if i % 4 == 3:
            del cap                                  # unconsumed: its destructor releases it
        elif kind == "dl":
            x = np.from_dlpack(Capsule(cap, dev))
            check(int(x[0]) == int(src[0]), "dl-handed", k, i)
        else:
            got = pa.table(Capsule(cap))
            check(got.num_rows == src.num_rows, "arrow-handed", k, i)


def traced_round(k, i):
    """NumPy work that leaves nothing alive, in a scope of this thread"""
    with capsan.trace() as tr:
        a = np.arange(256, dtype=np.float64) * i
        b = np.from_dlpack(a)
        c = np.concatenate([b, np.ones(16)])
        check(float(c[-1]) == 1.0, "traced", k, i)
        del a, b, c
    if tr.findings:
        errors.append(("scope", k, i, [f.kind for f in tr.findings]))


def worker(k, deadline):
    try:
        i = 0
        while time.monotonic() < deadline:
            b = dlpack_round(k, i)
            t = arrow_round(k, i)
            if i % 2 == 0:
                hand_over(k, i, b, t)
            take_over(k)
            tmp = [np.empty(64 << (i % 6)) for _ in range(4)]  # NumPy blocks of mixed sizes
            del tmp
            if capsan is not None and i % SCOPE_EVERY == k % SCOPE_EVERY:
                traced_round(k, i)
            i += 1
        rounds[k] = i
    except Exception as e:  # noqa: BLE001
        errors.append(repr(e))


start = time.monotonic()
deadline = start + SECONDS
threads = [threading.Thread(target=worker, args=(k, deadline)) for k in range(THREADS)]
for th in threads:
    th.start()
for th in threads:
    th.join()
for k in range(THREADS):  # what the last rounds handed over
    take_over(k)
warnings.filterwarnings("ignore", "This process .* is multi-threaded", DeprecationWarning)
pid = os.fork()
if pid == 0:
    ok = int(np.from_dlpack(np.arange(5)).sum()) == 10 and pa.table({"a": [1, 2]}).num_rows == 2
    os._exit(0 if ok else 3)
_, status = os.waitpid(pid, 0)
if os.waitstatus_to_exitcode(status) != 0:
    errors.append(("child", status))
faulthandler.cancel_dump_traceback_later()
gil = sys._is_gil_enabled() if hasattr(sys, "_is_gil_enabled") else True
print(f"ft stress: {THREADS} threads x {time.monotonic() - start:.1f}s, rounds={sum(rounds)} "
      f"(min {min(rounds)}), handed={sum(handed)}, scopes={capsan is not None}, gil={gil}, errors={errors[:5]}")
sys.exit(1 if errors or min(rounds) == 0 else 0)
