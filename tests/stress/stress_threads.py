"""16 threads exchanging numpy <-> torch tensors and allocating and freeing
NumPy arrays across threads, while one more thread switches NEP 49
handlers.

Workers (16): numpy -> torch -> numpy round trips, fixture tensors into
torch and numpy, numpy's and torch's capsules into a C consumer, NumPy
allocations and reallocations; a share of every kind of object goes
through a shared queue and is dropped by whichever thread takes it (so
arrays are freed, and torch releases foreign tensors without the GIL,
in threads that did not make them).

Switcher (1): installs np_aligned's handler in its context, allocates,
reallocates and exports through it, switches back to numpy's default,
allocates again, and hands everything to the queue; the aligned
handler's own counters must show every block it made aligned.

True bugs, each exactly as many times as asked and spread over the
threads by turns:
  LEAKS       dlconsumer.consume_leak          dlpack-leak at `# <-- leak`
  NPLEAKS     np_leaky.new_leaked (a refcount  numpy-leak at `# <-- npleak`
              leak of a >= 2 KiB array: too big for numpy 1.24's block cache)
  RECONSUMES  dlconsumer.consume_twice         dlpack-reconsume at `# <-- reconsume`
  DEVICE      an array from devhandler (pinned memory) exported to torch by
              the switcher                     dlpack-device-mismatch at `# <-- device`

argv: ITER LEAKS NPLEAKS RECONSUMES DEVICE
"""
import gc
import queue
import sys
import threading

import numpy as np
import torch

import devhandler
import dlconsumer as C
import dlproducer as P
import np_aligned as AL
import np_leaky as L
import stress_common

stress_common.watchdog()

ITER, LEAKS, NPLEAKS, RECONSUMES, DEVICE = map(int, sys.argv[1:6])
WORKERS = 16

shared = queue.Queue()
errors = []
turns = stress_common.Turns(leak=LEAKS, npleak=NPLEAKS, reconsume=RECONSUMES)
size_lock = threading.Lock()
npleak_sizes = iter(range(256, 256 + 100000))


def leak():
    C.consume_leak(P.good(4))  # <-- leak


def npleak():
    with size_lock:
        n = next(npleak_sizes)
    L.new_leaked(n)  # <-- npleak


def reconsume():
    first, second = C.consume_twice(P.good(3))  # <-- reconsume
    if first != 3.0 or second is not True:
        errors.append(("reconsume read", first, second))


def drop_some(k):
    """Drop objects other threads made."""
    for _ in range(2):
        try:
            shared.get_nowait()
        except queue.Empty:
            return


def worker(k):
    try:
        for i in range(ITER):
            n = 1 + (i * 7 + k) % 64
            a = np.arange(n, dtype=np.int64) + k
            t = torch.from_dlpack(a)
            b = np.from_dlpack(t * 1)
            if int(b[-1]) != n - 1 + k:
                errors.append(("roundtrip", k, i))
            f = torch.from_dlpack(P.Exporter(n))
            g = np.from_dlpack(P.Exporter(n, dtype="int64"))
            if float(f.sum()) != n * (n - 1) / 2 or int(g.sum()) != n * (n - 1) // 2:
                errors.append(("fixture", k, i))
            if C.consume_good(np.ones(n).__dlpack__()) != float(n):
                errors.append(("numpy capsule", k, i))
            if C.consume_good(torch.ones(n, dtype=torch.float32).__dlpack__()) != float(n):
                errors.append(("torch capsule", k, i))
            x = np.ones(64 * n)
            x.resize(128 * n, refcheck=False)  # a NumPy realloc
            if i % 3 == 0:
                shared.put((a, t, b, x))  # freed by whoever takes them
            elif i % 3 == 1:
                shared.put((f, g))
            del a, t, b, f, g, x
            drop_some(k)
            if i % 4 == k % 4:
                if turns.take("leak"):
                    leak()
                elif turns.take("npleak"):
                    npleak()
                elif turns.take("reconsume"):
                    reconsume()
    except Exception as e:  # noqa: BLE001
        errors.append(repr(e))


def export_pinned():
    prev = devhandler.install()
    pinned = np.arange(16, dtype=np.float32)
    devhandler.restore(prev)
    tp = torch.from_dlpack(pinned)  # <-- device
    shared.put((pinned, tp))


def switcher(rounds):
    try:
        devices_left = DEVICE
        for i in range(rounds):
            old = AL.set_handler(AL.handler())
            try:
                arrs = [np.arange(1 + j * 37, dtype=np.float64) for j in range(8)]
                big = np.zeros(5000)
                big.resize(9000, refcheck=False)
                if not all(AL.aligned(x) for x in arrs + [big]):
                    errors.append(("not aligned", i))
                t = torch.from_dlpack(arrs[3])  # aligned memory on loan to torch
            finally:
                AL.set_handler(old)
            plain = [np.ones(1 + j * 11) for j in range(8)]
            shared.put((arrs, big, t))
            shared.put(plain)
            if devices_left and i % 2 == 0:
                devices_left -= 1
                export_pinned()
            del arrs, big, t, plain
        while devices_left:
            devices_left -= 1
            export_pinned()
    except Exception as e:  # noqa: BLE001
        errors.append(repr(e))


stress_common.run_threads([(worker, (k,)) for k in range(WORKERS)] +
                          [(switcher, (max(ITER // 2, 1),))])
turns.finish(leak=leak, npleak=npleak, reconsume=reconsume)
while not shared.empty():
    shared.get_nowait()
gc.collect()
allocs, frees, live, misaligned = AL.stats()
assert not errors, errors[:5]
assert misaligned == 0, misaligned
assert allocs > 0 and live == 0, (allocs, frees, live)
print(f"threads ok {WORKERS} x {ITER}, aligned blocks {allocs}", flush=True)
