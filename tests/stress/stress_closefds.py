"""A program that closes every descriptor, twice, with 4 threads exchanging
tensors (run with record_all=1, so that the trace keeps growing: past its
first 8 MiB chunk after the descriptors are gone).

The first os.closerange(0, 2**20) comes after the first exchanges
(capsan's trace is open by then), while the threads wait at a barrier.
The program then opens OUTFILE (O_APPEND) and /dev/null twice and checks
that it got descriptors 0, 1 and 2 (capsan must not hold any of them),
and lets the threads go on. Everything it reports goes to OUTFILE
(descriptor 0); stdout and stderr are /dev/null from then on. The second
close, of everything above 2, comes while the threads exchange.

(The threads wait during the first close and the opens because capsan's
unwinder, libunwind, takes descriptors 0 and 1 for a pipe of its own when
it finds its old ones closed: tests/stress/stress_fd_guest.py reproduces
that bug deterministically.)

True bugs: the parent leaks LEAKS tensors after the first close
(`# <-- leak`), then forks a child that exchanges tensors and leaks one
(`# <-- child-leak`) and exits normally; both exit with capsan's status
23, the parent after waiting for the child (the child's status is
written to OUTFILE).

argv: ITER LEAKS OUTFILE
"""
import os
import sys
import threading

import numpy as np
import torch

import dlconsumer as C
import dlproducer as P
import stress_common

stress_common.watchdog()

ITER, LEAKS, OUT = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
THREADS = 4
errors = []
gate = threading.Barrier(THREADS + 1)
opened = threading.Barrier(THREADS + 1)
halfway = threading.Barrier(THREADS + 1)
BARRIERS = (gate, opened, halfway)


def exchange(k, i):
    n = 1 + (i + k) % 16
    a = np.arange(n, dtype=np.float32)
    t = torch.from_dlpack(a)
    b = np.from_dlpack(t + 0)
    if C.consume_good(P.good(n)) != n * (n - 1) / 2 or float(b.sum()) != n * (n - 1) / 2:
        errors.append(("exchange", k, i))


def worker(k):
    try:
        for i in range(50):
            exchange(k, i)
        gate.wait()  # the main thread closes everything and opens its files
        opened.wait()
        for i in range(ITER):
            exchange(k, i)
            if i == ITER // 2:
                halfway.wait()  # the second close comes while we run
    except Exception as e:  # noqa: BLE001
        errors.append(repr(e))
        for b in BARRIERS:
            b.abort()


def say(line):
    os.write(0, (line + "\n").encode())


ths = [threading.Thread(target=worker, args=(k,)) for k in range(THREADS)]
for th in ths:
    th.start()
try:
    gate.wait()
    os.closerange(0, 1 << 20)
    fds = [os.open(OUT, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644),
           os.open(os.devnull, os.O_WRONLY), os.open(os.devnull, os.O_WRONLY)]
    opened.wait()
    if fds[0] != 0:  # then say() below cannot work: leave a word in OUTFILE
        os.write(fds[0], f"fds {' '.join(map(str, fds))}\n".encode())
        raise SystemExit(3)
    say(f"fds {' '.join(map(str, fds))}")
    for _ in range(LEAKS):
        C.consume_leak(P.good(4))  # <-- leak
    halfway.wait()
    os.closerange(3, 1 << 20)
except BaseException:
    for b in BARRIERS:  # a main thread that failed must not leave them waiting
        b.abort()
    raise
for th in ths:
    th.join()

pid = stress_common.fork()
if pid == 0:
    for i in range(200):
        exchange(0, i)
    C.consume_leak(P.good(6))  # <-- child-leak
    say("child ok" if not errors else f"child errors {errors[:3]}")
    sys.exit(0)
_, status = os.waitpid(pid, 0)
say(f"child status {os.waitstatus_to_exitcode(status)}")
say(f"closefds ok {THREADS * ITER}" if not errors else f"errors {errors[:5]}")
