"""The ready-made handlers keep their promises.

aligned(A): every data pointer is a multiple of A, on every path numpy
allocates by (malloc, calloc, realloc through a.resize and fromiter, sort
scratch, concatenate, copies), for several alignments.

shared_memory(name): arrays live in a MAP_SHARED file; a second process maps
it and reads the data (and writes into it: the parent sees that).
Prints `RESULT {json}`."""
import gc
import json
import os
import subprocess
import sys

import numpy as np
# numpy 2 imports numpy.random lazily, at first use: its module data would
# come from the handler installed then (numpy 1.x imports it with numpy)
import numpy.random  # noqa: F401

import importlib

A = importlib.import_module("capsan.allocator")  # capsan.allocator may be re-exported as a function
AL = importlib.import_module("capsan.allocators")

res = {"aligned": {}}
for align in (64, 4096):
    h = AL.aligned(align)
    bad, n = [], 0
    with A.using(h):
        arrs = []
        for i in range(1, 300, 7):
            arrs += [np.empty(i), np.zeros(i, dtype=np.int8), np.ones((i, 3), dtype=np.float32)]
        a = np.arange(10.0)
        for size in (1, 100, 5000, 20, 100000, 3):
            a.resize(size, refcheck=False)  # realloc, shrinking and growing
            arrs.append(a.copy())
            if a.ctypes.data % align:
                bad.append(("resize", size))
            n += 1
        arrs.append(np.fromiter(range(10000), dtype=np.int64))  # grows by realloc
        c = np.random.default_rng(1).permutation(3000)
        c.sort(kind="mergesort")
        arrs += [c, np.concatenate(arrs[:2]), np.empty(0), np.empty((4, 0))]
    for x in arrs:
        n += 1
        if x.ctypes.data % align:
            bad.append(("array", x.shape))
    res["aligned"][str(align)] = {"checked": n, "misaligned": bad, "name": A.handler_name(arrs[0]),
                                  "resize_name": A.handler_name(a),
                                  "sorted": c.tolist() == list(range(3000))}
    del arrs, a, c, h
    gc.collect()

# shared memory, read by another process
shm_name = f"capsan_test_{os.getpid()}"
shm = AL.shared_memory(shm_name, size=8 << 20)
with A.using(shm):
    x = np.arange(100000, dtype=np.float64)
    y = np.zeros((64, 64), dtype=np.int32)
    y[3, :] = 7
    z = np.fromiter(range(1000), dtype=np.int16)
res["shm"] = {"path": shm.path, "names": [A.handler_name(x), A.handler_name(y)],
              "inside": [0 <= shm.offset(v) < shm.capacity for v in (x, y, z)]}
child = r"""
import json, sys
import numpy as np
from capsan.allocators import attach
specs = json.loads(sys.argv[1])
out = [float(attach(**s).sum()) for s in specs]
w = attach(**specs[1], mode="r+")
w[0, 0] = 12345          # the parent must see this
print(json.dumps(out))
"""
specs = [shm.describe(x), shm.describe(y), shm.describe(z), shm.describe(y[3, ::2])]
cp = subprocess.run([sys.executable, "-c", child, json.dumps(specs)], capture_output=True,
                    text=True, timeout=60)
res["shm"]["child_rc"] = cp.returncode
res["shm"]["child_stderr"] = cp.stderr[-2000:]
res["shm"]["child_sums"] = json.loads(cp.stdout) if cp.returncode == 0 else None
res["shm"]["parent_sums"] = [float(x.sum()), float(y.sum()), float(z.sum()),
                             float(y[3, ::2].sum())]
res["shm"]["child_write_seen"] = int(y[0, 0])
res["shm"]["used_before_free"] = shm.used
del x, z
gc.collect()
res["shm"]["used_after_free"] = shm.used
# out of room: numpy raises MemoryError
with A.using(shm):
    try:
        np.empty(16 << 20, dtype=np.uint8)
        res["shm"]["too_big"] = "allocated"
    except MemoryError:
        res["shm"]["too_big"] = "MemoryError"
path = shm.path
del shm  # the handler (and the mapping) lives on in y
res["shm"]["file_while_array_lives"] = os.path.exists(path)
res["shm"]["y_still_readable"] = int(y[3].sum())
del y
gc.collect()
res["shm"]["file_after"] = os.path.exists(path)
res["live_handlers"] = A.live_handlers()
print("RESULT " + json.dumps(res))
