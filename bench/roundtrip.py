"""W2: numpy <-> torch DLPack round trips. Prints the loop's own time (the
import of torch is not part of what capsan should be judged on)."""
import sys
import time

import loopmark  # bench/loopmark.py

import numpy as np
import torch

n = int(sys.argv[1]) if len(sys.argv) > 1 else 100000
a = np.arange(16, dtype=np.float32)
t = torch.arange(16, dtype=torch.float32)
loopmark.loop_starts()  # callgrind counts from here (bench/icount.py)
t0, c0 = time.perf_counter(), time.process_time()
for _ in range(n // 2):
    x = torch.from_dlpack(a)    # numpy -> torch
    y = np.from_dlpack(t)       # torch -> numpy
    del x, y
t1, c1 = time.perf_counter(), time.process_time()
loopmark.loop_ends()
# wall and CPU seconds of the loop alone: on a shared VM the CPU time is
# the steadier of the two
print(t1 - t0, c1 - c0)
