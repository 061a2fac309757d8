"""fork() while other threads export.

15 threads exchange tensors without pause (numpy -> torch -> numpy,
fixture tensors into torch, numpy's and torch's capsules into a C
consumer; torch releases foreign tensors without the GIL). Meanwhile the
main thread forks:

- BUSY children, each forked while the 15 threads are in the middle of
  their exchanges (inside capsan's hooks, with or without the GIL). A
  child exchanges more tensors itself from 2 new threads, commits exactly
  one dlpack-reconsume (`# <-- child-reconsume`) and leaves with
  os._exit(0): tensors the vanished threads were holding are never
  released in the child, and _exit means no leak check there (as with
  LeakSanitizer). capsan's exit status for the error: 23.
- QUIET children, forked while the 15 threads wait at a barrier having
  dropped everything they held. A child exchanges tensors, leaks exactly
  one (`# <-- child-leak`) and exits normally: its leak check must find
  that one and nothing else. Exit status 23.

The parent leaks exactly one tensor too (`# <-- parent-leak`). It waits
for every child with a deadline (a child that does not finish is killed
and reported as hung) and prints each child's exit status.

argv: ITER BUSY QUIET   (ITER: exchanges per child thread)
"""
import os
import signal
import sys
import threading
import time

import numpy as np
import torch

import dlconsumer as C
import dlproducer as P
import stress_common

stress_common.watchdog()

ITER, BUSY, QUIET = map(int, sys.argv[1:4])
EXPORTERS = 15
CHILD_DEADLINE = 60.0

stop = threading.Event()
park = threading.Event()
parked = threading.Barrier(EXPORTERS + 1)
resume = threading.Barrier(EXPORTERS + 1)
errors = []
done = [0] * EXPORTERS


def exchange(k, i):
    n = 1 + (i + k) % 32
    a = np.arange(n, dtype=np.float32)
    t = torch.from_dlpack(a)
    b = np.from_dlpack(t + 0)
    f = torch.from_dlpack(P.Exporter(n))
    s1 = C.consume_good(np.ones(n).__dlpack__())
    s2 = C.consume_good(torch.ones(n, dtype=torch.float32).__dlpack__())
    if float(b.sum()) != n * (n - 1) / 2 or float(f.sum()) != n * (n - 1) / 2 or s1 != s2:
        errors.append(("exchange", k, i))


def exporter(k):
    try:
        i = 0
        while not stop.is_set():
            exchange(k, i)
            i += 1
            done[k] = i
            if park.is_set():
                parked.wait()  # nothing held: exchange()'s locals are gone
                resume.wait()
    except Exception as e:  # noqa: BLE001
        errors.append(repr(e))


def child_threads():
    cerr = []

    def run(k):
        try:
            for i in range(ITER):
                exchange(100 + k, i)
        except Exception as e:  # noqa: BLE001
            cerr.append(repr(e))

    stress_common.run_threads((run, (k,)) for k in range(2))
    return cerr + errors


def busy_child():
    try:
        errs = child_threads()
        C.consume_twice(P.good(3))  # <-- child-reconsume
        if errs:
            print("child errors", errs[:3], flush=True)
            os._exit(3)
        print("busy child ok", flush=True)
    except BaseException as e:  # noqa: BLE001
        print("busy child failed", repr(e), flush=True)
        os._exit(4)
    os._exit(0)


def quiet_child():
    errs = child_threads()
    C.consume_leak(P.good(5))  # <-- child-leak
    if errs:
        print("child errors", errs[:3], flush=True)
        sys.exit(3)
    print("quiet child ok", flush=True)
    sys.exit(0)


def wait_all(pids):
    out = {}
    deadline = time.monotonic() + CHILD_DEADLINE
    pending = set(pids)
    while pending:
        for pid in list(pending):
            got, status = os.waitpid(pid, os.WNOHANG)
            if got:
                out[pid] = os.waitstatus_to_exitcode(status)
                pending.discard(pid)
        if pending and time.monotonic() > deadline:
            for pid in pending:
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
                out[pid] = "hung"
            break
        time.sleep(0.01)
    return out


ths = [threading.Thread(target=exporter, args=(k,)) for k in range(EXPORTERS)]
for th in ths:
    th.start()
while min(done) < 3:  # every exporter is in its loop
    time.sleep(0.001)

statuses = {}
busy = []
for f in range(BUSY):
    time.sleep(0.002 * (f % 5))
    sys.stdout.flush()
    pid = stress_common.fork()
    if pid == 0:
        busy_child()
    busy.append(pid)
statuses.update({pid: ("busy", st) for pid, st in wait_all(busy).items()})

park.set()
parked.wait()
quiet = []
for f in range(QUIET):
    sys.stdout.flush()
    pid = stress_common.fork()
    if pid == 0:
        quiet_child()
    quiet.append(pid)
statuses.update({pid: ("quiet", st) for pid, st in wait_all(quiet).items()})
park.clear()
resume.wait()

time.sleep(0.05)
C.consume_leak(P.good(7))  # <-- parent-leak
stop.set()
for th in ths:
    th.join()
assert not errors, errors[:5]
for pid, (kind, st) in sorted(statuses.items()):
    print(f"child {pid} {kind} status {st}", flush=True)
print(f"fork ok busy {BUSY} quiet {QUIET} exchanges {sum(done)}", flush=True)
