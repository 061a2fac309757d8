"""W2: numpy <-> torch DLPack round trips. Prints the loop's own time (the
import of torch is not part of what capsan should be judged on).

    roundtrip.py [back|alive] N

back (W2b): the round trip back to the producer, the most common DLPack
pattern in mixed code: torch consumes a NumPy export, and NumPy consumes
torch's re-export of that same memory (each re-export asks whether its
memory is a consumed tensor's).
alive (W5): W2's loop while 10,000 exported tensors (consumed by torch, not
released) and 10,000 NumPy blocks stay alive: an event must cost the same
with them as without (no lookup that grows with what is alive)."""
import sys

import loopmark  # bench/loopmark.py
import time

import numpy as np
import torch

mode = sys.argv[1] if len(sys.argv) > 2 else ""
n = int(sys.argv[-1]) if len(sys.argv) > 1 else 100000
a = np.arange(16, dtype=np.float32)
t = torch.arange(16, dtype=torch.float32)
keep = []
if mode == "alive":
    keep = [np.full(4, i, dtype=np.float32) for i in range(10000)]
    keep += [torch.from_dlpack(np.full(4, i, dtype=np.float32)) for i in range(10000)]
loopmark.loop_starts()  # callgrind counts from here (bench/icount.py)
t0, c0 = time.perf_counter(), time.process_time()
if mode == "back":
    for _ in range(n // 2):
        x = torch.from_dlpack(a)    # numpy -> torch
        y = np.from_dlpack(x)       # torch's re-export of a's memory -> numpy
        del x, y
else:
    for _ in range(n // 2):
        x = torch.from_dlpack(a)    # numpy -> torch
        y = np.from_dlpack(t)       # torch -> numpy
        del x, y
t1, c1 = time.perf_counter(), time.process_time()
loopmark.loop_ends()
# wall and CPU seconds of the loop alone: on a shared VM the CPU time is
# the steadier of the two
print(t1 - t0, c1 - c0)
