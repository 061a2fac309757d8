"""Capsule names that end exactly at the end of a mapped page, the next
page PROT_NONE, from 4 threads at once (tests/stress/st_names.c).

- Names with no NUL (every prefix of a DLPack name, DLPack names whole,
  "mem_handler", names of 1-17 bytes across the 8-byte words capsan
  compares): made, asked for with other unterminated names (GetPointer,
  IsValid), renamed to more of them, dropped. None is a DLPack capsule,
  so none is a finding, and none may fault capsan.
- Tensors exported as "dltensor" whose NUL is the page's last byte:
  consumed by numpy, torch and a C consumer, or dropped unconsumed (the
  producer's destructor releases them, then unmaps the name: CPython lets
  a destructor free the name). All clean.
- LEAKS of those consumed by dlconsumer.consume_leak: exactly LEAKS
  dlpack-leak findings, at the line marked `# <-- leak`.
- BAD of those renamed by their consumer to "used_dltensor" with no NUL
  at the page end (not the name R7 asks for: a dlpack-bad-tensor at
  `# <-- badrename`), then dropped: the producer's destructor sees no
  "dltensor" and leaves the tensor alone, so it leaks too (a dlpack-leak
  whose capsule died unconsumed).

argv: ITERATIONS (per thread) LEAKS BAD
"""
import gc
import sys

import numpy as np
import torch

import dlconsumer as C
import st_names as S
import stress_common

stress_common.watchdog()

ITER = int(sys.argv[1])
LEAKS = int(sys.argv[2])
BAD = int(sys.argv[3])
THREADS = 4

UNTERMINATED = [b"d", b"dl", b"dlt", b"dltenso", b"dltensor", b"dltensor_", b"dltensor_v",
                b"dltensor_versione", b"dltensor_versioned", b"u", b"used_dl", b"used_dltensor",
                b"used_dltensor_versioned", b"n", b"numpy_dltensor", b"numpy_dltensor_versioned",
                b"m", b"mem_handle", b"mem_handler", b"x", b"x" * 7, b"x" * 8, b"x" * 9,
                b"x" * 15, b"x" * 16, b"x" * 17]
QUERIES = [b"q", b"dltensoX", b"dltensor", b"used_dltensor", b"mem_handler", b"xylophone",
           b"numpy_dltensor"]


def safe(name, terminated, query):
    """strcmp(name, query) stops inside the mapped bytes of both: they
    differ before either runs out (a terminated name ends in its NUL,
    which no query has)."""
    a = name + (b"\0" if terminated else b"")
    m = min(len(a), len(query))
    return a[:m] != query[:m]


class Producer:
    """An exporter whose capsule's name sits at a page end (NUL last)."""

    def __dlpack__(self, **kw):
        return S.make(b"dltensor", terminated=True, tensor=True)

    def __dlpack_device__(self):
        return (1, 0)


errors = []
turns = stress_common.Turns(leak=LEAKS, bad=BAD)


def leak():
    C.consume_leak(S.make(b"dltensor", terminated=True, tensor=True))  # <-- leak


def bad_rename():
    cap = S.make(b"dltensor", terminated=True, tensor=True)
    S.rename(cap, b"used_dltensor")  # <-- badrename
    del cap


def worker(k):
    try:
        for i in range(ITER):
            # names with no NUL: nothing DLPack, nothing to find
            name = UNTERMINATED[(i + k) % len(UNTERMINATED)]
            cap = S.make(name, tensor=bool(i & 1))
            for q in QUERIES:
                if safe(name, False, q):
                    if S.query(cap, q) != (False, False):
                        errors.append(("query matched", name, q))
            other = UNTERMINATED[(i * 7 + k + 3) % len(UNTERMINATED)]
            S.rename(cap, other)
            if i % 5 == 0:
                S.rename(cap, b"used_dltensor_versioned"[: 1 + i % 23])
            del cap
            # a DLPack export whose terminated name ends the page
            way = (i + k) % 5
            if way == 0:
                a = np.from_dlpack(Producer())
                if a.tolist() != [0.0, 1.0, 2.0, 3.0]:
                    errors.append(("numpy read", a.tolist()))
                del a
            elif way == 1:
                t = torch.from_dlpack(Producer())
                if t.tolist() != [0.0, 1.0, 2.0, 3.0]:
                    errors.append(("torch read", t.tolist()))
                del t
            elif way == 2:
                if C.consume_good(S.make(b"dltensor", terminated=True, tensor=True)) != 6.0:
                    errors.append("consume_good")
            elif way == 3:
                cap = S.make(b"dltensor", terminated=True, tensor=True)
                for q in QUERIES:
                    if safe(b"dltensor", True, q) and S.query(cap, q) != (False, False):
                        errors.append(("query matched dltensor", q))
                del cap  # unconsumed: its producer releases it
            elif turns.take("leak"):
                leak()
            elif turns.take("bad"):
                bad_rename()
    except Exception as e:  # noqa: BLE001
        errors.append(repr(e))


stress_common.run_threads((worker, (k,)) for k in range(THREADS))
turns.finish(leak=leak, bad=bad_rename)
gc.collect()
pages, tensors = S.live()
assert not errors, errors[:5]
assert pages == 0, f"{pages} name pages still mapped"
assert tensors == LEAKS + BAD, f"{tensors} tensors alive, {LEAKS + BAD} leaked on purpose"
print(f"names ok {THREADS * ITER}", flush=True)
