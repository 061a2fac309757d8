"""Overhead benchmarks: each workload runs plain and under capsan in one
invocation, interleaved and repeated, and the ratio of medians is printed.
Ratios, not absolute times, are the targets (see docs/overhead.md).

report_throughput(): `capsan report` on a generated 10-million-event trace
(bench/report_gen.c): events per second for text, JSON and HTML, and the peak
RSS, which must not grow with the number of events.
BENCH_ONLY=report runs only that; BENCH_REPORT_EVENTS sets the size.

allocator_cost(): ns per np.empty(64) under numpy's default handler, a ctypes
handler and a Python-callable one made with capsan.allocator().
BENCH_ONLY=allocator runs only that; BENCH_ALLOCS sets the count.

roundtrips(): W2 on Debian's stack and on the cp311 venv's (numpy 2,
torch 2.13); BENCH_ONLY=w2 runs only that.

longrun(): bench/longrun.py, 50 million DLPack exchange and NumPy allocation
events in one process (BENCH_LONGRUN_EVENTS sets the number), plain and
under capsan, and the same at a tenth of that: capsan's RSS above the plain
run at each checkpoint and its trace, which must not grow with the number
of events. BENCH_ONLY=longrun runs only that.

xapi_calls(): W3 (bench/xapi_calls.py), 200,000 tvm-ffi calls taking and
returning a torch tensor, on the cp311 venv (apache-tvm-ffi); skipped
with a message where tvm_ffi does not import. BENCH_ONLY=w3 runs only that.

ft_scaling(): W6 (bench/ft_threads.py) on the free-threaded 3.13t of
`make newest`, the GIL off: DLPack and Arrow exchanges on 1, 2 and 8
threads at once, plain and under capsan, interleaved; capsan's ratio at
each thread count side by side, which must not grow with the threads.
Then the same under callgrind: capsan's instructions a round at each
thread count (BENCH_FT_CG=0 leaves that out). BENCH_ONLY=ft runs only
that; BENCH_FT_ROUNDS sets the rounds a thread.

icount.main() (bench/icount.py): instructions per loop iteration of W1,
W2 and W3 under callgrind, plain, under capsan (stacks on, off) and under
memray: the figures that do not drift. It runs first; BENCH_ONLY=icount
runs only that (`make bench-quick` adds BENCH_CG_QUICK=1)."""
import glob
import json
import os
import resource
import shutil
import statistics
import struct
import subprocess
import sys
import tempfile
import time

import icount  # bench/icount.py

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PY = "/usr/bin/python3"
LIB = os.environ.get("BENCH_LIB") or os.path.join(ROOT, "build", "lib", "libcapsan.so")
REPEAT = int(os.environ.get("BENCH_REPEAT", "5"))


def timed(argv, env, inner, notes=None):
    """(wall, cpu) seconds: of the whole process, or (inner) of the loop the
    workload timed itself and printed as "wall cpu" on its last line.
    capsan's SUMMARY line, when a run had findings, goes to notes (a set)."""
    r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    cp = subprocess.run(argv, env=env, check=True, stdout=subprocess.PIPE,
                        stderr=subprocess.PIPE if notes is not None else None, text=True)
    out = cp.stdout
    wall = time.perf_counter() - t0
    r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    if notes is not None:
        notes.update(ln for ln in cp.stderr.splitlines() if ln.startswith("SUMMARY: capsan:"))
    if inner:
        w, c = out.strip().splitlines()[-1].split()
        return float(w), float(c)
    return wall, (r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime)


def ratios(times, name, base):
    """Median wall and CPU time of a configuration, and their ratios to base."""
    w = statistics.median(t[0] for t in times[name])
    c = statistics.median(t[1] for t in times[name])
    bw = statistics.median(t[0] for t in times[base])
    bc = statistics.median(t[1] for t in times[base])
    return w, c, w / bw, c / bc


def noise_note(plain):
    """The spread of the plain runs' wall times: this VM has phases in
    which the same loop takes up to 1.6x longer, and a ratio measured in
    one says more about the phase than about capsan."""
    walls = [t[0] for t in plain]
    spread = max(walls) / min(walls)
    if spread > 1.15:
        print(f"  note: the plain runs varied by {100 * (spread - 1):.0f}% "
              f"({min(walls):.3f}..{max(walls):.3f}s): a noisy phase, the ratios above are "
              f"unreliable; run again (BENCH_REPEAT raises the runs)")


def measure(label, argv, configs, inner=False):
    tmp = tempfile.mkdtemp(prefix="capsan-bench-")
    times = {name: [] for name, _ in configs}
    notes = {name: set() for name, _ in configs}
    for _ in range(REPEAT):
        for name, opts in configs:
            env = dict(os.environ)
            if opts is not None:
                env["LD_PRELOAD"] = LIB
                # a finding is named below, but does not stop the measurement
                env["CAPSAN_OPTIONS"] = f"log_path={tmp}/t:keep_trace=always:exitcode=0:" + opts
            times[name].append(timed(argv, env, inner, notes[name]))
    w, c, _, _ = ratios(times, "plain", "plain")
    what = "loop" if inner else "process"
    print(f"{label}: plain {what} {w:.3f}s wall, {c:.3f}s CPU (medians of {REPEAT})")
    ratio = {}
    for name, _ in configs[1:]:
        w, c, rw, rc = ratios(times, name, "plain")
        ratio[name] = rw
        print(f"  {name:32s} {w:.3f}s wall  ratio {rw:.2f}x | {c:.3f}s CPU  ratio {rc:.2f}x")
        for note in sorted(notes[name]):
            print(f"    (findings in this configuration: {note})")
    noise_note(times["plain"])
    subprocess.run(["rm", "-rf", tmp])
    return ratio


def run_report(capsan, fmt, trace, out):
    """One `capsan report`: (wall seconds, CPU seconds, peak RSS in KiB)."""
    t0 = time.perf_counter()
    p = subprocess.Popen([capsan, "report", "--format", fmt, "-o", out, trace],
                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _, status, ru = os.wait4(p.pid, 0)
    wall = time.perf_counter() - t0
    err = p.stderr.read().decode(errors="replace")
    p.stderr.close()
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"capsan report --format {fmt} {trace} failed: {err}")
    return wall, ru.ru_utime + ru.ru_stime, ru.ru_maxrss


def report_throughput():
    """capsan report on a synthetic record_all-style trace: export / consume /
    delete / destroy and NumPy alloc / free cycles, a few findings."""
    n = int(os.environ.get("BENCH_REPORT_EVENTS", "10000000"))
    capsan = os.path.join(ROOT, "build", "bin", "capsan")
    gen = os.path.join(ROOT, "build", "bench", "report_gen")
    os.makedirs(os.path.dirname(gen), exist_ok=True)
    subprocess.run(["cc", "-O2", "-std=c11", "-Wall", "-Wextra", "-Werror",
                    "-I" + os.path.join(ROOT, "model"), "-o", gen,
                    os.path.join(ROOT, "bench", "report_gen.c")], check=True)
    tmp = tempfile.mkdtemp(prefix="capsan-bench-report-")
    try:
        trace = os.path.join(tmp, "capsan.trace.31337")
        t0 = time.perf_counter()
        info = subprocess.run([gen, trace, str(n)], check=True, stdout=subprocess.PIPE,
                              text=True).stdout.strip()
        size = os.path.getsize(trace)
        print(f"capsan report on a generated trace: {info}, {size / 2**20:.0f} MiB "
              f"(written in {time.perf_counter() - t0:.1f}s)")
        reps = max(1, min(REPEAT, 3))
        for fmt in ("text", "json", "html"):
            out = os.path.join(tmp, "out." + fmt)
            runs = [run_report(capsan, fmt, trace, out) for _ in range(reps)]
            wall = statistics.median(r[0] for r in runs)
            cpu = statistics.median(r[1] for r in runs)
            rss = max(r[2] for r in runs)
            print(f"  {fmt:5s} {wall:6.2f}s wall  {n / wall / 1e6:5.1f}M events/s  "
                  f"({n / cpu / 1e6:5.1f}M events per CPU-second)  peak RSS {rss / 1024:6.1f} MiB")
        os.unlink(trace)
        # memory must not grow with the number of events that were freed:
        # every object at a fresh address is the worst case for the tables
        small, big = max(n // 10, 1000), n
        rss = {}
        for k in (small, big):
            u = os.path.join(tmp, f"unique.{k}")
            subprocess.run([gen, u, str(k), "--unique"], check=True, stdout=subprocess.DEVNULL)
            rss[k] = run_report(capsan, "json", u, os.path.join(tmp, "u.json"))[2]
            os.unlink(u)
        print(f"  fresh addresses: peak RSS {rss[small] / 1024:.1f} MiB at {small} events, "
              f"{rss[big] / 1024:.1f} MiB at {big} events (ratio {rss[big] / rss[small]:.2f}x "
              f"for {big // small}x the events)")
    finally:
        subprocess.run(["rm", "-rf", tmp])


ALLOC_WORKLOAD = r"""
import ctypes, sys, time
from ctypes import c_size_t, c_void_p
import numpy as np
import capsan
capsan.stop()  # the handler's own cost, not capsan's tracing
import importlib
A = importlib.import_module("capsan.allocator")
n, rounds = int(sys.argv[1]), int(sys.argv[2])
libc = ctypes.CDLL(None)
for f, r, a in (("malloc", c_void_p, [c_size_t]), ("calloc", c_void_p, [c_size_t, c_size_t]),
                ("realloc", c_void_p, [c_void_p, c_size_t]), ("free", None, [c_void_p])):
    getattr(libc, f).restype, getattr(libc, f).argtypes = r, a
m, c, r, f = libc.malloc, libc.calloc, libc.realloc, libc.free
handlers = {
    "default (numpy)": None,
    "ctypes (libc, C speed)": A.allocator("c", malloc=m, calloc=c, realloc=r, free=f),
    "Python callables": A.allocator("py", malloc=lambda k: m(k), calloc=lambda a, b: c(a, b),
                                    realloc=lambda p, k: r(p, k), free=lambda p, k: f(p)),
}
times = {k: [] for k in handlers}
empty = np.empty
for _ in range(rounds):
    for name, h in handlers.items():
        with A.using(h):
            t0 = time.perf_counter_ns()
            for _ in range(n):
                empty(64)
            times[name].append((time.perf_counter_ns() - t0) / n)
for name, ts in times.items():
    ts.sort()
    print(name, ts[len(ts) // 2])
"""


def allocator_cost():
    """Per-allocation cost of a NEP 49 handler made with capsan.allocator():
    N x np.empty(64) (one malloc and one free each) under numpy's default
    handler, a ctypes handler (libc's functions, called from C through the
    drop-ctx thunk) and a Python-callable one. BENCH_ALLOCS sets N."""
    n = os.environ.get("BENCH_ALLOCS", "200000")
    tmp = tempfile.mkdtemp(prefix="capsan-bench-alloc-")
    env = dict(os.environ, PYTHONPATH=os.path.join(ROOT, "build", "python"))
    env.pop("LD_PRELOAD", None)
    try:
        out = subprocess.run([PY, "-c", ALLOC_WORKLOAD, n, str(REPEAT)], env=env, cwd=tmp,
                             check=True, stdout=subprocess.PIPE, text=True).stdout
    finally:
        subprocess.run(["rm", "-rf", tmp])
    rows = [ln.rsplit(" ", 1) for ln in out.strip().splitlines()]
    base = float(rows[0][1])
    print(f"NEP 49 handler cost ({n} x np.empty(64), median of {REPEAT}):")
    for name, ns in rows:
        ns = float(ns)
        extra = "" if name.startswith("default") else f"  (+{ns - base:.0f} ns per alloc+free)"
        print(f"  {name:24s} {ns:7.0f} ns/alloc{extra}")


def numpy_alloc():
    """W1: bench/numpy_alloc.py (>= 1M NumPy array creations of mixed sizes,
    with temporaries) plain, under tracemalloc (1 and 25 frames) and under
    capsan (native + Python stacks; stacks off), interleaved and repeated in
    one invocation; the workload's own loop time, ratios of medians."""
    n = os.environ.get("BENCH_NUMPY_ARRAYS", "1000000")
    script = os.path.join(ROOT, "bench", "numpy_alloc.py")
    configs = [  # (name, interpreter options, CAPSAN_OPTIONS or None)
        ("plain", [], None),
        ("python3 -X tracemalloc=1", ["-X", "tracemalloc=1"], None),
        ("python3 -X tracemalloc=25", ["-X", "tracemalloc=25"], None),
        ("capsan, native+python stacks", [], ""),
        ("capsan, stacks off", [], "native_depth=0:python_depth=0"),
    ]
    tmp = tempfile.mkdtemp(prefix="capsan-bench-np-")
    times = {name: [] for name, _, _ in configs}
    try:
        for _ in range(REPEAT):
            for name, xopts, opts in configs:
                env = dict(os.environ)
                env.pop("PYTHONTRACEMALLOC", None)
                if opts is not None:
                    env["LD_PRELOAD"] = LIB
                    env["CAPSAN_OPTIONS"] = f"log_path={tmp}/t:keep_trace=always:" + opts
                times[name].append(timed([PY, *xopts, script, n], env, True))
    finally:
        subprocess.run(["rm", "-rf", tmp])
    w, c, _, _ = ratios(times, "plain", "plain")
    print(f"W1 NumPy array creations ({n}, mixed sizes, temporaries): plain loop {w:.3f}s wall, "
          f"{c:.3f}s CPU (medians of {REPEAT})")
    ratio = {}
    for name, _, _ in configs[1:]:
        w, c, rw, rc = ratios(times, name, "plain")
        ratio[name] = rc
        print(f"  {name:32s} {w:.3f}s wall  ratio {rw:.2f}x | {c:.3f}s CPU  ratio {rc:.2f}x")
    noise_note(times["plain"])
    tm1 = ratio["python3 -X tracemalloc=1"]
    cs = ratio["capsan, native+python stacks"]
    verdict = "met" if cs <= tm1 / 2 else "NOT met"
    print(f"  target (issue 3): capsan with stacks <= half of tracemalloc=1's ratio = "
          f"{tm1 / 2:.2f}x, aiming at 1.50x: {cs:.2f}x, {verdict}")


def stack_versions(py):
    out = subprocess.run([py, "-c", "import numpy, torch; print(numpy.__version__, "
                          "torch.__version__)"], stdout=subprocess.PIPE, text=True)
    return out.stdout.split() if out.returncode == 0 else ["?", "?"]


W2_TARGETS = (("capsan, native+python stacks", 1.5), ("capsan, stacks off", 1.15))


def roundtrips():
    """W2 (bench/roundtrip.py) on each stack: Debian's python3 (numpy 1.24
    and torch 1.13, unversioned DLPack) and the cp311 venv (numpy 2 and
    torch 2.13, which negotiate versioned capsules), each against its own
    plain run; then both stacks' ratios side by side.
    BENCH_ONLY=w2 runs only this."""
    n = os.environ.get("BENCH_EXCHANGES", "200000")
    stacks = [("Debian", PY)]
    cur = icount.venv_python("cp311")
    if cur:
        stacks.append(("cp311", cur))
    else:
        print("W2 on torch 2: skipped, no cp311 venv (make venvs)")
    results = {}
    for name, py in stacks:
        np_v, torch_v = stack_versions(py)
        w2 = measure(f"W2 numpy<->torch DLPack round trips ({n} exchanges), {name}: "
                     f"numpy {np_v}, torch {torch_v}",
                     [py, os.path.join(ROOT, "bench", "roundtrip.py"), n],
                     [("plain", None),
                      ("capsan, native+python stacks", ""),
                      ("capsan, stacks off", "native_depth=0:python_depth=0")], inner=True)
        results[f"{name} (torch {torch_v})"] = w2
    print("W2 wall-time ratios, stack by stack:")
    for cfg, limit in W2_TARGETS:
        cells = "   ".join(f"{name} {r[cfg]:.2f}x" for name, r in results.items())
        worst = max(r[cfg] for r in results.values())
        verdict = "met" if worst <= limit else "NOT met"
        print(f"  {cfg:30s} {cells}   target (issue 2) <= {limit:.2f}x: {verdict}")


W3_TARGET = ("capsan, native+python stacks", 1.3)


def xapi_calls():
    """W3 (bench/xapi_calls.py) on the cp311 venv: tvm-ffi calls through
    DLPack 1.3's exchange API, no capsules. Target (issue 21): stacks on
    <= 1.3x plain. BENCH_ONLY=w3 runs only this."""
    n = os.environ.get("BENCH_XAPI_CALLS", "200000")
    py = icount.venv_python("cp311")
    if not py:
        print("W3 tvm-ffi calls: skipped, no cp311 venv (make venvs)")
        return
    probe = subprocess.run([py, "-c", "import tvm_ffi, torch; print(tvm_ffi.__version__)"],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if probe.returncode != 0:
        why = (probe.stderr.strip().splitlines() or ["?"])[-1]
        print(f"W3 tvm-ffi calls: skipped, tvm_ffi does not import in {py} ({why}); "
              f"apache-tvm-ffi comes with the cp311 venv of make venvs")
        return
    np_v, torch_v = stack_versions(py)
    r = measure(f"W3 tvm-ffi calls taking and returning a torch tensor ({n} calls of "
                f"testing.echo), cp311: torch {torch_v}, tvm_ffi {probe.stdout.strip()}",
                [py, os.path.join(ROOT, "bench", "xapi_calls.py"), n],
                [("plain", None),
                 ("capsan, native+python stacks", ""),
                 ("capsan, stacks off", "native_depth=0:python_depth=0")], inner=True)
    cfg, limit = W3_TARGET
    verdict = "met" if r[cfg] <= limit else "NOT met"
    print(f"  target (issue 21): {cfg} <= {limit:.2f}x by wall time: {r[cfg]:.2f}x, {verdict}")


W4_TARGET = ("capsan, native+python stacks", 1.1)


def arrow_exchange():
    """W4 (bench/arrow_exchange.py) on the Arrow cp311 venv: a pyarrow reader
    of 20,000 small batches scanned by duckdb, and 100,000 polars <-> pyarrow
    round trips through stream capsules. Target (issue 19): stacks on <=
    1.1x plain, each. BENCH_ONLY=w4 runs only this."""
    py = icount.venv_python("cp311", "arrowvenvs.txt")
    if not py:
        print("W4 Arrow exchanges: skipped, no Arrow cp311 venv (make arrow-venvs)")
        return
    cfg, limit = W4_TARGET
    for what, n in (("stream", os.environ.get("BENCH_W4_BATCHES", "20000")),
                    ("roundtrip", os.environ.get("BENCH_W4_ROUNDTRIPS", "100000"))):
        label = ("W4 pyarrow -> duckdb stream of %s batches" if what == "stream"
                 else "W4 %s polars <-> pyarrow round trips") % n
        r = measure(label + " (cp311 Arrow venv)",
                    [py, os.path.join(ROOT, "bench", "arrow_exchange.py"), what, n],
                    [("plain", None),
                     ("capsan, native+python stacks", ""),
                     ("capsan, stacks off", "native_depth=0:python_depth=0")], inner=True)
        verdict = "met" if r[cfg] <= limit else "NOT met"
        print(f"  target (issue 19): {cfg} <= {limit:.2f}x by wall time: {r[cfg]:.2f}x, {verdict}")


TRACE_RECORDS = {1: "PAD", 2: "PROCESS", 3: "MODULE", 4: "CODE", 5: "FRAME", 6: "EVENT",
                 7: "THREAD", 8: "END", 9: "OPTIONS", 10: "COUNTS"}


def trace_records(path):
    """(bytes written, {record name: (count, bytes)}) of one trace: its
    records up to the zero header that ends what was written
    (reports/FORMAT.md). The file itself is bigger, grown in 8 MiB chunks."""
    with open(path, "rb") as f:
        data = f.read()
    off = struct.unpack_from("<I", data, 12)[0]
    recs = {}
    while off + 8 <= len(data):
        typ, _, size = struct.unpack_from("<HHI", data, off)
        if size < 8:
            break
        name = TRACE_RECORDS.get(typ, str(typ))
        count, nbytes = recs.get(name, (0, 0))
        recs[name] = (count + 1, nbytes + size)
        off += size
    return off, recs


def longrun_once(py, n, tmp, capsan_opts):
    """One run of bench/longrun.py: {checkpoint %: (RSS KiB, file-backed
    KiB)}, peak RSS KiB, loop wall seconds, and under capsan (capsan_opts
    not None) the trace's path."""
    env = dict(os.environ)
    env.pop("LD_PRELOAD", None)
    trace = None
    if capsan_opts is not None:
        d = tempfile.mkdtemp(prefix="run-", dir=tmp)
        env["LD_PRELOAD"] = LIB
        env["CAPSAN_OPTIONS"] = f"log_path={d}/t:exitcode=0" + capsan_opts
    out = subprocess.run([py, os.path.join(ROOT, "bench", "longrun.py"), str(n)], env=env,
                         check=True, stdout=subprocess.PIPE, text=True).stdout.splitlines()
    marks, peak = {}, 0
    for ln in out:
        f = ln.split()
        if f[0] == "checkpoint":
            marks[int(f[1])] = (int(f[3]), int(f[4]))
        elif f[0] == "maxrss":
            peak = int(f[1])
    if capsan_opts is not None:
        traces = glob.glob(os.path.join(d, "t.*"))
        if len(traces) != 1:
            raise SystemExit(f"longrun: expected one trace in {d}, found {traces}")
        trace = traces[0]
    return marks, peak, float(out[-1].split()[0]), trace


def trace_events(trace):
    """The events capsan observed, as `capsan report --format json` sums them."""
    capsan = os.path.join(ROOT, "build", "bin", "capsan")
    out = subprocess.run([capsan, "report", "--format", "json", trace], check=True,
                         stdout=subprocess.PIPE, text=True).stdout
    return sum(p["summary"]["events"] for p in json.loads(out)["processes"])


LONGRUN_TOLERANCE_MIB = 1.0  # growth of capsan's RSS overhead that still counts as flat


def longrun():
    """Bounded memory in long runs (issue 14): bench/longrun.py reaches N
    DLPack exchange and NumPy allocation events (default 50 million,
    BENCH_LONGRUN_EVENTS) with a bounded live set and eight call sites, plain
    and under capsan (stacks on, write-behind trace), then the same at N/10.
    Printed: capsan's RSS above the plain run at 10%, 50% and 100% of N and
    at the peak; whether it grew from 10% to 100% (flat within
    LONGRUN_TOLERANCE_MIB); the trace written, per million events and by
    record type; and N/10 against N, which should be about equal, not 10x.
    RSS and trace size are the figures: one run each, so wall times are only
    indicative. Debian's stack, and the cp311 venv's when `make venvs` made
    it. BENCH_ONLY=longrun runs only this."""
    n = int(os.environ.get("BENCH_LONGRUN_EVENTS", "50000000"))
    stacks = [("Debian", PY)]
    cur = icount.venv_python("cp311")
    if cur:
        stacks.append(("cp311", cur))
    tmp = tempfile.mkdtemp(prefix="capsan-bench-long-")
    mib = 1024.0
    try:
        for name, py in stacks:
            np_v, torch_v = stack_versions(py)
            print(f"Long run, bench/longrun.py, {name}: numpy {np_v}, torch {torch_v} "
                  f"(one process; live set 256 exchanges + 256 arrays, 8 call sites):")
            res = {}
            for k in (n // 10, n):
                plain = longrun_once(py, k, tmp, None)
                cap = longrun_once(py, k, tmp, "")
                events = trace_events(cap[3])
                written, recs = trace_records(cap[3])
                st = os.stat(cap[3])
                over = {p: (cap[0][p][0] - plain[0][p][0]) / mib for p in sorted(cap[0])}
                fover = {p: (cap[0][p][1] - plain[0][p][1]) / mib for p in sorted(cap[0])}
                peak = (cap[1] - plain[1]) / mib
                res[k] = (over[100], written, recs)
                print(f"  {k:,} events: capsan saw {events:,}; loop {plain[2]:.1f}s plain, "
                      f"{cap[2]:.1f}s under capsan ({cap[2] / plain[2]:.2f}x)")
                print("    RSS above plain: " +
                      "  ".join(f"{p}% {v:.1f} MiB" for p, v in over.items()) +
                      f"  peak {peak:.1f} MiB  (plain: {plain[0][100][0] / mib:.0f} MiB at 100%)")
                print("      of which file-backed (the trace's 8 MiB chunks, capsan's libraries): " +
                      "  ".join(f"{p}% {v:.1f} MiB" for p, v in fover.items()))
                grew = over[100] - over[10]
                verdict = "flat" if grew < LONGRUN_TOLERANCE_MIB else "GROWS"
                print(f"    from 10% to 100%: {grew:+.2f} MiB, {verdict} "
                      f"(tolerance {LONGRUN_TOLERANCE_MIB:.0f} MiB)")
                print(f"    trace: {written / 2**20:.2f} MiB written "
                      f"({written / 2**20 / (events / 1e6):.4f} MiB per million events; "
                      f"the file is {st.st_size / 2**20:.0f} MiB, {st.st_blocks * 512 / 2**20:.2f} "
                      f"MiB on disk)")
                print("    records: " + ", ".join(
                    f"{r} {c:,} ({b / 1024:.0f} KiB)"
                    for r, (c, b) in sorted(recs.items(), key=lambda x: -x[1][1])))
            (o1, w1, r1), (o2, w2, r2) = res[n // 10], res[n]
            rss = "flat" if o2 - o1 < LONGRUN_TOLERANCE_MIB else "GROWS"
            print(f"  {n // 10:,} vs {n:,} events (10x): RSS above plain {o1:.1f} vs {o2:.1f} MiB "
                  f"({rss}), trace {w1 / 2**20:.2f} vs {w2 / 2**20:.2f} MiB ({w2 / w1:.2f}x)")
            grown = [(r, r2[r][0] - r1.get(r, (0, 0))[0], r2[r][1] - r1.get(r, (0, 0))[1])
                     for r in r2]
            grown = [g for g in grown if g[2] > 0]
            if grown:
                why = (" (COUNTS: one record per 10 ms while events happen, so it follows"
                       " the run's time, not its events)"
                       if any(g[0] == "COUNTS" for g in grown) else "")
                print("    what the trace gained: " + ", ".join(
                    f"{r} +{c:,} records (+{b / 1024:.0f} KiB)" for r, c, b in grown) + why)
    finally:
        subprocess.run(["rm", "-rf", tmp])


FT_THREADS = (1, 2, 8)
FT_GROWTH = 1.15  # the 8-thread ratio over the 1-thread one that still counts as flat


def ft_python():
    """The free-threaded 3.13t's python from build/newest.txt (on the host:
    no chroot), or None."""
    try:
        with open(os.path.join(ROOT, "build", "newest.txt")) as f:
            for line in f:
                tag, root, py, _ = (line.split() + ["", "", "", ""])[:4]
                if tag == "cp313t" and root == "-":
                    return py
    except OSError:
        pass
    return None


def ft_scaling():
    """W6 (bench/ft_threads.py): every thread does the same rounds, so the
    work grows with the threads. Each repetition runs every thread count
    plain and under capsan (stacks on) back to back: a phase of the shared
    VM weighs on both. Printed per thread count: the medians, capsan's
    ratio of medians by wall and by CPU time, and the range of the
    per-repetition ratios; then whether the ratio grows from 1 to 8
    threads. With fewer cores than threads the threads take turns: the
    ratio still says whether capsan's share of the work grows, not whether
    8 threads run 8 times as fast."""
    py = ft_python()
    if not py:
        print("W6 free-threaded exchanges: skipped, no cp313t (make newest)")
        return
    probe = subprocess.run([py, "-c", "import sys, numpy, pyarrow; print(numpy.__version__, "
                            "pyarrow.__version__, sys._is_gil_enabled())"],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if probe.returncode != 0:
        print(f"W6 free-threaded exchanges: skipped, numpy or pyarrow does not import in {py}")
        return
    np_v, pa_v, gil = probe.stdout.split()
    n = os.environ.get("BENCH_FT_ROUNDS", "30000")
    script = os.path.join(ROOT, "bench", "ft_threads.py")
    tmp = tempfile.mkdtemp(prefix="capsan-bench-ft-")
    times = {(k, c): [] for k in FT_THREADS for c in ("plain", "capsan")}
    notes = set()
    try:
        for _ in range(REPEAT):
            for k in FT_THREADS:
                for c in ("plain", "capsan"):
                    env = dict(os.environ)
                    env.pop("LD_PRELOAD", None)
                    if c == "capsan":
                        env["LD_PRELOAD"] = LIB
                        env["CAPSAN_OPTIONS"] = f"log_path={tmp}/t:keep_trace=always:exitcode=0"
                    times[(k, c)].append(timed([py, script, str(k), n], env, True, notes))
    finally:
        subprocess.run(["rm", "-rf", tmp])
    print(f"W6 free-threaded DLPack and Arrow exchanges (bench/ft_threads.py, {n} rounds a "
          f"thread), cp313t: numpy {np_v}, pyarrow {pa_v}, GIL {'on' if gil == 'True' else 'off'}, "
          f"{os.cpu_count()} cores; medians of {REPEAT}, capsan with stacks:")
    med = statistics.median
    ratio = {}
    for k in FT_THREADS:
        p, c = times[(k, "plain")], times[(k, "capsan")]
        rw = med(t[0] for t in c) / med(t[0] for t in p)
        rc = med(t[1] for t in c) / med(t[1] for t in p)
        each_w = [b[0] / a[0] for a, b in zip(p, c)]
        each_c = [b[1] / a[1] for a, b in zip(p, c)]
        ratio[k] = (rw, rc)
        print(f"  {k} thread{'s' if k > 1 else ' '}: plain {med(t[0] for t in p):.3f}s wall "
              f"{med(t[1] for t in p):.3f}s CPU, capsan {med(t[0] for t in c):.3f}s wall "
              f"{med(t[1] for t in c):.3f}s CPU | ratio wall {rw:.2f}x "
              f"({min(each_w):.2f}..{max(each_w):.2f}), CPU {rc:.2f}x "
              f"({min(each_c):.2f}..{max(each_c):.2f})")
    for note in sorted(notes):
        print(f"    (findings under capsan: {note})")
    for k in FT_THREADS:
        noise = [t[0] for t in times[(k, "plain")]]
        if max(noise) / min(noise) > 1.15:
            print(f"  note: the plain {k}-thread runs varied by "
                  f"{100 * (max(noise) / min(noise) - 1):.0f}%: a noisy phase, run again "
                  f"(BENCH_REPEAT raises the runs)")
            break
    lo, hi = FT_THREADS[0], FT_THREADS[-1]
    for i, what in ((0, "wall"), (1, "CPU")):
        g = ratio[hi][i] / ratio[lo][i]
        verdict = "flat" if g <= FT_GROWTH else "GROWS"
        print(f"  {what} ratio at {hi} threads over {lo}: {g:.2f} ({verdict}, flat up to "
              f"{FT_GROWTH:.2f})")
    if os.environ.get("BENCH_FT_CG", "1") != "0":
        ft_instructions(py, script)


def ft_instructions(py, script):
    """W6 under callgrind, the same total rounds at each thread count,
    counted from the threads' start to their end (bench/loopmark.py):
    instructions a round, plain and under capsan. Callgrind runs one
    thread at a time, so this shows whether capsan's paths change with
    the threads (a lock's slow path, a spin, an event judged elsewhere),
    not what cache lines shared between cores cost."""
    if shutil.which("valgrind") is None:
        print("  W6 instruction counts: skipped, no valgrind")
        return
    os.makedirs(os.path.dirname(icount.MARK_SO), exist_ok=True)
    subprocess.run(["cc", "-O2", "-fPIC", "-shared", "-Wall", "-Wextra", "-Werror", "-o",
                    icount.MARK_SO, os.path.join(ROOT, "bench", "cgmark.c")], check=True)
    total = int(os.environ.get("BENCH_FT_CG_ROUNDS", "8000"))
    print(f"  under callgrind ({total} rounds in all at each thread count), instructions a round:")
    for k in FT_THREADS:
        per = {}
        for c in ("plain", "capsan"):
            d = tempfile.mkdtemp(prefix="capsan-bench-ftcg-")
            env = dict(os.environ, BENCH_CG_MARK=icount.MARK_SO, PYTHONHASHSEED="0")
            env.pop("LD_PRELOAD", None)
            if c == "capsan":
                env["LD_PRELOAD"] = LIB
                env["CAPSAN_OPTIONS"] = f"log_path={d}/t:keep_trace=always:exitcode=0"
            out = os.path.join(d, "cg.out")
            cmd = ["valgrind", "--tool=callgrind", "--instr-atstart=no", "--trace-children=no",
                   "--dump-instr=no", f"--callgrind-out-file={out}", py, script, str(k),
                   str(total // k)]
            try:
                subprocess.run(cmd, env=env, cwd=d, check=True, stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL)
                if c == "capsan" and icount.trace_summary(d) is None:
                    raise SystemExit(f"capsan wrote no trace under callgrind: {' '.join(cmd)}")
                per[c] = icount.totals(out + ".1") / total
            finally:
                subprocess.run(["rm", "-rf", d])
        print(f"    {k} thread{'s' if k > 1 else ' '}: plain {per['plain']:.0f}, capsan "
              f"{per['capsan']:.0f} (+{per['capsan'] - per['plain']:.0f}), "
              f"ratio {per['capsan'] / per['plain']:.2f}x")


def startup():
    """import numpy, torch: capsan patches each new object once (target 1.3x).
    BENCH_ONLY=startup runs only this."""
    measure("start-up: import numpy, torch",
            [PY, "-c", "import numpy, torch"],
            [("plain", None), ("capsan", "")])


def main():
    if os.environ.get("BENCH_ONLY") == "icount":
        icount.main()
        return
    if os.environ.get("BENCH_ONLY") == "w3":
        xapi_calls()
        return
    if os.environ.get("BENCH_ONLY") == "w4":
        arrow_exchange()
        return
    if os.environ.get("BENCH_ONLY") == "startup":
        startup()
        return
    if os.environ.get("BENCH_ONLY") == "w2":
        roundtrips()
        return
    if os.environ.get("BENCH_ONLY") == "report":
        report_throughput()
        return
    if os.environ.get("BENCH_ONLY") == "numpy":
        numpy_alloc()
        return
    if os.environ.get("BENCH_ONLY") == "allocator":
        allocator_cost()
        return
    if os.environ.get("BENCH_ONLY") == "longrun":
        longrun()
        return
    if os.environ.get("BENCH_ONLY") == "ft":
        ft_scaling()
        return
    icount.main()
    roundtrips()
    xapi_calls()
    arrow_exchange()
    ft_scaling()
    numpy_alloc()
    startup()
    allocator_cost()
    report_throughput()
    longrun()


if __name__ == "__main__":
    main()
