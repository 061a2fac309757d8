"""Overhead benchmarks: each workload runs plain and under capsan in one
invocation, interleaved and repeated, and the ratio of medians is printed.
Ratios, not absolute times, are the targets (see README)."""
import os
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PY = "/usr/bin/python3"
LIB = os.path.join(ROOT, "build", "lib", "libcapsan.so")
REPEAT = int(os.environ.get("BENCH_REPEAT", "5"))


def timed(argv, env, inner):
    """Wall time of the process, or the time the workload printed."""
    t0 = time.perf_counter()
    out = subprocess.run(argv, env=env, check=True, stdout=subprocess.PIPE, text=True).stdout
    wall = time.perf_counter() - t0
    return float(out.strip().splitlines()[-1]) if inner else wall


def measure(label, argv, configs, inner=False):
    tmp = tempfile.mkdtemp(prefix="capsan-bench-")
    times = {name: [] for name, _ in configs}
    for _ in range(REPEAT):
        for name, opts in configs:
            env = dict(os.environ)
            if opts is not None:
                env["LD_PRELOAD"] = LIB
                env["CAPSAN_OPTIONS"] = f"log_path={tmp}/t:" + opts
            times[name].append(timed(argv, env, inner))
    base = statistics.median(times["plain"])
    what = "loop time" if inner else "wall time"
    print(f"{label}: plain {base:.3f}s {what} (median of {REPEAT})")
    for name, _ in configs[1:]:
        m = statistics.median(times[name])
        print(f"  {name:32s} {m:.3f}s  ratio {m / base:.2f}x")
    subprocess.run(["rm", "-rf", tmp])


def main():
    n = os.environ.get("BENCH_EXCHANGES", "200000")
    measure(f"W2 numpy<->torch DLPack round trips ({n} exchanges)",
            [PY, os.path.join(ROOT, "bench", "roundtrip.py"), n],
            [("plain", None),
             ("capsan, native+python stacks", ""),
             ("capsan, stacks off", "native_depth=0:python_depth=0")], inner=True)
    measure("start-up: import numpy, torch",
            [PY, "-c", "import numpy, torch"],
            [("plain", None), ("capsan", "")])


if __name__ == "__main__":
    main()
