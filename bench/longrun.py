"""Long run: argv[1] events (default 1,000,000) of DLPack exchanges and NumPy
allocations in one process, with a bounded live set and a fixed set of call
sites, so that a sanitizer's memory and trace should stop growing once the
live set is reached.

Each iteration does, from one of SITES functions (a bounded number of
distinct call sites):
  - one numpy -> torch exchange (torch.from_dlpack of a NumPy array) and one
    torch -> numpy exchange (np.from_dlpack of a tensor), whose results go
    into a ring of LIVE slots (an exchange dies when its slot is reused, so
    exchanges are released LIVE iterations later, not at once);
  - np.empty, np.zeros and z * 2.0 + z, whose sum replaces an array in
    another ring of LIVE slots; the rest are freed at once.

capsan counts EVENTS_PER_ITER = 16 events per iteration, on numpy 1.24 /
torch 1.13 and on numpy 2 / torch 2.13 alike (measured with `capsan report
--format json`, the summary's "events", at two sizes): export, consume and
delete for each exchange, and an alloc and a free for each of five NumPy
data allocations. The loop runs argv[1] // EVENTS_PER_ITER iterations; the
driver (bench/run.py, longrun()) prints capsan's own count beside the
target (which adds the few hundred events of importing numpy and torch).

Prints, at 10%, 50% and 100% of the iterations, a line
    checkpoint PCT ITERATIONS RSS_KIB FILE_KIB
with the current RSS from /proc/self/statm and the part of it that is
file-backed (a sanitizer's mapped trace is), then
    maxrss KIB          (getrusage ru_maxrss: the peak)
    WALL CPU            (the loop's own wall and CPU seconds, last line)."""
import os
import resource
import sys
import time

import numpy as np
import torch

EVENTS_PER_ITER = 16
LIVE = 256          # live exchanges and live arrays: the bounded live set
SITES = 8           # distinct call sites (functions), cycled
SIZES = (1, 3, 8, 64, 100, 257, 1000, 2000, 5000)
PAGE = os.sysconf("SC_PAGE_SIZE")


def rss_kib():
    """Resident KiB, and the part of it that is file-backed or shared
    (/proc/self/statm's resident and shared fields)."""
    with open("/proc/self/statm") as f:
        fields = f.read().split()
    return int(fields[1]) * PAGE // 1024, int(fields[2]) * PAGE // 1024


def make_site(k):
    """A distinct function (its own code object, so its own Python stack)
    for call site k."""
    src = f"""
def site_{k}(a, t, k, ring_x, ring_y, ring_a, slot):
    ring_x[slot] = torch.from_dlpack(a)   # numpy -> torch
    ring_y[slot] = np.from_dlpack(t)      # torch -> numpy
    e = np.empty(k)
    z = np.zeros(k)
    ring_a[slot] = z * 2.0 + z            # a temporary, then the sum kept
    del e, z
"""
    ns = {"np": np, "torch": torch}
    exec(compile(src, f"<longrun site {k}>", "exec"), ns)
    return ns[f"site_{k}"]


def main():
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 1_000_000
    iters = max(n // EVENTS_PER_ITER, 1)
    sites = [make_site(k) for k in range(SITES)]
    srcs = [np.arange(16, dtype=np.float32) + k for k in range(SITES)]
    tens = [torch.arange(16, dtype=torch.float32) + k for k in range(SITES)]
    ring_x, ring_y, ring_a = [None] * LIVE, [None] * LIVE, [None] * LIVE
    marks = {max(iters * p // 100, 1): p for p in (10, 50, 100)}
    t0, c0 = time.perf_counter(), time.process_time()
    for i in range(1, iters + 1):
        s = i % SITES
        # slot i * 7 mod LIVE: every slot in turn, in a shuffled order
        sites[s](srcs[s], tens[s], SIZES[i % len(SIZES)], ring_x, ring_y, ring_a,
                 (i * 7) % LIVE)
        if i in marks:
            print("checkpoint {} {} {} {}".format(marks[i], i, *rss_kib()), flush=True)
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    print(f"maxrss {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss}")
    # wall and CPU seconds of the loop alone, last line
    print(wall, cpu)


if __name__ == "__main__":
    main()
