"""W3: tvm-ffi calls that take and return a torch tensor -- argv[1] calls
(default 200,000) of tvm-ffi's "testing.echo", which gets the tensor
through tvm-ffi's C exchange with torch (DLPack 1.3's exchange API, no
capsule) and hands it back as a torch.Tensor. capsan follows these
exchanges since issue 18 (bench/icount.py prints the events it saw per
call; before, it saw none).

Needs apache-tvm-ffi (the cp311 venv of .ci/venvs): without it, prints why
on stderr and exits with status 77, which bench/run.py and bench/icount.py
report as a skip. Prints the loop's own time, like the other workloads."""
import sys
import time

import loopmark  # bench/loopmark.py

SKIP = 77
try:
    import tvm_ffi
except ImportError as e:
    print(f"W3 skipped: no tvm_ffi in {sys.executable} ({e}); "
          f"it needs apache-tvm-ffi (the cp311 venv, make venvs)", file=sys.stderr)
    sys.exit(SKIP)
import torch

echo = tvm_ffi.get_global_func("testing.echo", allow_missing=True)
if echo is None:
    print(f"W3 skipped: tvm_ffi {tvm_ffi.__version__} has no global function "
          f"testing.echo", file=sys.stderr)
    sys.exit(SKIP)

n = int(sys.argv[1]) if len(sys.argv) > 1 else 200_000
t = torch.arange(16, dtype=torch.float32)
r = echo(t)  # once before the loop: the first call sets up the exchange
if not isinstance(r, torch.Tensor) or r.data_ptr() != t.data_ptr():
    print(f"W3 skipped: testing.echo returned {type(r).__name__}, not the same "
          f"torch tensor", file=sys.stderr)
    sys.exit(SKIP)
del r
loopmark.loop_starts()  # callgrind counts from here (bench/icount.py)
t0, c0 = time.perf_counter(), time.process_time()
for _ in range(n):
    y = echo(t)             # torch -> tvm-ffi -> torch
    del y
t1, c1 = time.perf_counter(), time.process_time()
loopmark.loop_ends()
# wall and CPU seconds of the loop alone: on a shared VM the CPU time is
# the steadier of the two
print(t1 - t0, c1 - c0)
