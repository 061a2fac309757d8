"""dlclose of a hooked library, then another one loaded at the same address.

libst_reload_a.so and libst_reload_b.so (tests/stress/st_reload.c, one
source built twice) are loaded in turn with ctypes.PyDLL and unloaded with
_ctypes.dlclose, ROUNDS times: A, B, A, B, ... The two have the same size,
so the loader maps each into the hole the last one left: the program
prints how many loads landed at the first one's address.

Each round, while 3 other threads exchange numpy <-> torch tensors, the
loaded library exports tensors that numpy, torch and the library itself
consume, consumes numpy's and torch's, and drops some unconsumed. All of
that is correct, and every tensor of the library is released before it
is unloaded (checked: rl_live() == 0, and /proc/self/maps no longer shows
it). Capsan must hook every new copy: a consumer whose rename it missed
would look like one that deleted without renaming.

In each round of B, and only there, rl_leak() leaks one tensor (exported
and consumed by B, never deleted): exactly ROUNDS // 2 dlpack-leak
findings, each exported from libst_reload_b.so at `# <-- leak`.

argv: LIBDIR ROUNDS EXCHANGES_PER_ROUND
"""
import _ctypes
import ctypes
import gc
import sys
import threading

import numpy as np
import torch

import stress_common

stress_common.watchdog()
LIBDIR, ROUNDS, PER = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
PATHS = {"A": f"{LIBDIR}/libst_reload_a.so", "B": f"{LIBDIR}/libst_reload_b.so"}


def mapped(path):
    with open("/proc/self/maps") as f:
        return any(line.rstrip().endswith(path) for line in f)


def load(tag):
    lib = ctypes.PyDLL(PATHS[tag])
    for fn, res, args in (("rl_export", ctypes.py_object, [ctypes.c_ssize_t]),
                          ("rl_consume", ctypes.py_object, [ctypes.py_object]),
                          ("rl_leak", ctypes.py_object, [ctypes.c_ssize_t]),
                          ("rl_live", ctypes.c_long, []),
                          ("rl_tag", ctypes.c_int, [])):
        getattr(lib, fn).restype = res
        getattr(lib, fn).argtypes = args
    return lib


stop = threading.Event()
errors = []


def background(k):
    """numpy <-> torch traffic in other threads while libraries come and go."""
    try:
        i = 0
        while not stop.is_set():
            a = np.full(8 + k, i, dtype=np.int64)
            t = torch.from_dlpack(a)
            b = np.from_dlpack(t * 2)
            if int(b[0]) != 2 * i:
                errors.append(("background", k, i))
            i += 1
    except Exception as e:  # noqa: BLE001
        errors.append(repr(e))


def one_round(lib, tag):
    class Exporter:
        def __init__(self, n):
            self.n = n

        def __dlpack__(self, **kw):
            return lib.rl_export(self.n)

        def __dlpack_device__(self):
            return (1, 0)

    for i in range(PER):
        n = 1 + i % 13
        want = n * (n - 1) / 2
        a = np.from_dlpack(Exporter(n))
        t = torch.from_dlpack(Exporter(n))
        if float(a.sum()) != want or float(t.sum()) != want:
            errors.append(("read", tag, i))
        if lib.rl_consume(lib.rl_export(n)) != want:
            errors.append(("own", tag, i))
        if lib.rl_consume(np.arange(n, dtype=np.float32).__dlpack__()) != want:
            errors.append(("numpy's", tag, i))
        if lib.rl_consume(torch.arange(n, dtype=torch.float32).__dlpack__()) != want:
            errors.append(("torch's", tag, i))
        cap = lib.rl_export(n)  # dropped unconsumed: its destructor releases it
        del a, t, cap
    if tag == "B":
        lib.rl_leak(5)  # <-- leak


ths = [threading.Thread(target=background, args=(k,)) for k in range(3)]
for th in ths:
    th.start()
first = None
same = 0
for r in range(ROUNDS):
    tag = "AB"[r % 2]
    lib = load(tag)
    if lib.rl_tag() != ord(tag):
        errors.append(("tag", r))
    addr = ctypes.cast(lib.rl_export, ctypes.c_void_p).value
    if first is None:
        first = addr
    elif addr == first:
        same += 1
    one_round(lib, tag)
    gc.collect()
    live = lib.rl_live()
    if live != (1 if tag == "B" else 0):
        errors.append(("live", tag, live))
    handle = lib._handle
    del lib
    gc.collect()
    _ctypes.dlclose(handle)
    if mapped(PATHS[tag]):
        errors.append(("still mapped after dlclose", tag, r))
stop.set()
for th in ths:
    th.join()
assert not errors, errors[:5]
print(f"reloads {ROUNDS} same address {same}/{ROUNDS - 1}", flush=True)
print("reload ok", flush=True)
