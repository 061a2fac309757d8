"""Deleters that run after Py_Finalize.

4 threads hand tensors to st_atexit (tests/stress/st_atexit.c), which
consumes them and keeps them in static storage until the process exits:
- "atexit": released by a C atexit() handler st_atexit registered at
  import: fixture tensors (legacy and versioned), numpy's and torch's;
- "dtor": released by st_atexit's ELF destructor, which _dl_fini runs
  after every atexit handler: fixture tensors only (their deleter is
  plain C; torch's static objects are gone by then).
Both run after Py_Finalize, when the interpreter is gone; the release
code writes what it released to LOG ("atexit N", "dtor N").

Releasing a consumed tensor late is correct DLPack: none of these is
leaked. numpy's deleter, called after finalization, keeps its array on
purpose (numpy PR 22510), which capsan documents as no leak either.

Meanwhile the same threads exchange tensors that are released at once,
and leak exactly LEAKS (`# <-- leak`): the only true findings.

argv: ITER LEAKS LOG
"""
import sys

import numpy as np
import torch

import dlconsumer as C
import dlproducer as P
import st_atexit as S
import stress_common

stress_common.watchdog()

ITER, LEAKS, LOG = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
THREADS = 4
S.set_log(LOG)
errors = []
turns = stress_common.Turns(leak=LEAKS)


def leak():
    C.consume_leak(P.good(3))  # <-- leak


def worker(k):
    try:
        for i in range(ITER):
            n = 1 + (i + k) % 16
            S.hold(P.good(n), "atexit")
            S.hold(P.good(n), "dtor")
            S.hold(P.versioned(n), "dtor" if i % 2 else "atexit")
            if i % 4 == 0:
                S.hold(np.arange(n, dtype=np.float64).__dlpack__(), "atexit")
                S.hold(torch.arange(n).__dlpack__(), "atexit")
            # traffic released at once
            t = torch.from_dlpack(np.ones(n))
            if C.consume_good(P.good(n)) != n * (n - 1) / 2 or float(t.sum()) != n:
                errors.append(("exchange", k, i))
            if i % 8 == k % 8 and turns.take("leak"):
                leak()
    except Exception as e:  # noqa: BLE001
        errors.append(repr(e))


stress_common.run_threads((worker, (k,)) for k in range(THREADS))
turns.finish(leak=leak)
assert not errors, errors[:5]
at, dt = S.held()
print(f"held atexit {at} dtor {dt}", flush=True)
