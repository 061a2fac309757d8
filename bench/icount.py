"""Instructions per loop iteration under callgrind: the figures of `make
bench` that do not drift (issue 21). On this 2-core VM the same wall-clock
comparison moves by half its size within an hour; the number of
instructions a loop iteration executes does not (run to run, a few
instructions in millions).

Method. Each workload (W1 bench/numpy_alloc.py, W1d the same 50 Python
frames deep, W2 bench/roundtrip.py, W3 bench/xapi_calls.py) runs under `valgrind --tool=callgrind
--instr-atstart=no --trace-children=no`: the start-up (import numpy,
torch) runs uninstrumented, bench/loopmark.py turns instrumentation on
where the loop starts and dumps a part where it ends (client requests,
bench/cgmark.c); the rest, up to the end of the process, is the final
part. Each configuration runs with N iterations and with 0, and

    instructions per iteration = (count with N - count with 0) / N

(count = loop part + exit part): what does not depend on N (the exit, the
interpreter's teardown, capsan's report) cancels, and what grows with N
(a table scanned at exit, memray compressing its capture) stays in; a
line says so where the exit grew by more than 0.5%. `make bench-quick`
(BENCH_CG_QUICK=1) skips the 0-iteration runs and takes the loop part / N:
the same figure while the exit does not grow, in half the runs (each run
pays the start-up: 20-60 s with torch under valgrind). All threads are
counted (callgrind serializes them); these workloads start no children.
PYTHONHASHSEED=0 keeps the interpreter's own counts the same run to run.
capsan's one-time learning of its call chains (about 6 million
instructions in W1, 2 million in W2) is not start-up and stays in, spread
over N: N is large enough that it adds about 1% per iteration or less.

Configurations: plain; capsan with its default options (native and Python
stacks); capsan with stacks off (native_depth=0:python_depth=0); memray
run (its default mode: the allocator calls with Python stacks; not
--trace-python-allocators) and memray run --native (native stacks too),
from a pinned memray in a private venv for the same interpreter
(~/.cache/capsan/bench-venv/TAG, made once, which sees the stack's numpy
and torch). On Debian's /usr/bin/python3 (numpy 1.24, torch 1.13) and the
cp311 venv (numpy 2, torch 2.13; W3 needs its apache-tvm-ffi); W4
(bench/arrow_exchange.py: W4s a pyarrow reader's batches scanned by duckdb,
W4r polars -> pyarrow -> polars round trips) on the Arrow venv's cp311
(make arrow-venvs), stacks on, no memray. Quick:
memray's default mode on W1 only (the one target memray is in), and W3
without stacks off (its target is for stacks on).

Each capsan run's trace is read back (`capsan report --format json`) and
the events capsan saw per iteration are printed: a ratio near 1.00 with no
events would be a capsan that was not there.

Environment: BENCH_CG_QUICK=1 (above); BENCH_CG_ITERS (N for every
workload); BENCH_CG_JOBS (runs at once, default the number of CPUs);
BENCH_CG_MEMRAY=0 leaves memray out; BENCH_CG_PROFILE=1 also prints the 15
costliest functions of libcapsan.so per iteration, exclusive and
inclusive (stacks on, each workload but W4); BENCH_CG_WORKLOADS=W1,W2 and
BENCH_CG_STACKS=Debian,cp311 choose; BENCH_CG_VERBOSE=1 prints each run's
time; BENCH_CG_KEEP=1 keeps the callgrind outputs (for callgrind_annotate);
BENCH_LIB measures another libcapsan.so; BENCH_CG_FLOOR=1 (make
bench-floor) takes a runtime that writes no trace."""
import concurrent.futures
import json
import os
import shutil
import subprocess
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BENCH = os.path.join(ROOT, "bench")
LIB = os.environ.get("BENCH_LIB") or os.path.join(ROOT, "build", "lib", "libcapsan.so")
# the capsan CLI of the same build reads its traces back
CAPSAN = os.path.join(os.path.dirname(os.path.dirname(LIB)), "bin", "capsan")
if not os.path.exists(CAPSAN):
    CAPSAN = os.path.join(ROOT, "build", "bin", "capsan")
MARK_SO = os.path.join(ROOT, "build", "bench", "cgmark.so")
MEMRAY = "memray==1.20.0"
MEMRAY_VENVS = os.path.join(os.path.expanduser("~"), ".cache", "capsan", "bench-venv")
STACKS_OFF = "native_depth=0:python_depth=0"
SKIP = 77  # a workload's "skipped" exit status (bench/xapi_calls.py)
VERBOSE = os.environ.get("BENCH_CG_VERBOSE", "0") == "1"
FLOOR = os.environ.get("BENCH_CG_FLOOR", "0") == "1"
# the floor beside capsan (make bench, make bench-quick): a runtime built with
# -DCS_BENCH_FLOOR, whose events end as they start (make bench-floor says more)
FLOOR_LIB = os.environ.get("BENCH_FLOOR_LIB", "")
if FLOOR_LIB and not os.path.exists(FLOOR_LIB):
    FLOOR_LIB = ""
ONLY_WORKLOADS = os.environ.get("BENCH_CG_WORKLOADS", "").replace(",", " ").split()
ONLY_STACKS = os.environ.get("BENCH_CG_STACKS", "").replace(",", " ").split()

# name: script, what one iteration is, argv[1] per iteration, default N:
# large enough that capsan's one-time learning of its call chains (about
# 6 million instructions in W1, 2 million in W2) adds about 1% per
# iteration or less
WORKLOADS = {
    "W1": ("numpy_alloc.py", "NumPy array creations, one iteration = 5 arrays "
           "(empty, ones, a temporary, a sum, a strided copy)", 5, 10000),
    # W1 as a test under pytest runs it: 50 Python frames deep (no bar)
    "W1d": ("numpy_alloc.py deep", "W1's loop 50 Python frames deep, as under pytest, "
            "one iteration = 5 arrays", 5, 10000),
    "W2": ("roundtrip.py", "numpy<->torch DLPack round trips, one iteration = "
           "2 exchanges", 2, 10000),
    # the round trip back to the producer: torch's re-export of NumPy's memory
    "W2b": ("roundtrip.py back", "numpy -> torch -> numpy, the second export "
            "re-exporting what the first consume holds, one iteration = 2 exchanges", 2, 10000),
    # W2 with 10,000 consumed tensors and 10,000 NumPy blocks alive
    "W5": ("roundtrip.py alive", "W2's loop while 10,000 exported tensors and 10,000 "
           "NumPy blocks stay alive, one iteration = 2 exchanges", 2, 10000),
    "W3": ("xapi_calls.py", "tvm-ffi calls taking and returning a torch tensor, "
           "one iteration = 1 call", 1, 20000),
    # the Arrow stack's (make arrow-venvs), on its own interpreter
    "W4s": ("arrow_exchange.py stream", "a pyarrow reader scanned by duckdb through "
            "its stream capsule, one iteration = 1 batch", 1, 5000),
    "W4r": ("arrow_exchange.py roundtrip", "polars -> pyarrow -> polars through stream "
            "capsules, one iteration = 1 round trip", 1, 2000),
}
ARROW_ONLY = ("W4s", "W4r")
# name, kind, CAPSAN_OPTIONS or memray flags
CONFIGS = [
    ("plain", "plain", None),
    ("capsan, stacks on", "capsan", ""),
    ("capsan, stacks off", "capsan", STACKS_OFF),
    ("floor", "floor", ""),
    ("memray run", "memray", []),
    ("memray run --native", "memray", ["--native"]),
]
# (label, workload, configuration, against, limit): by instruction count
TARGETS = [
    ("W1 stacks on <= 1.25x plain", "W1", "capsan, stacks on", "plain", 1.25),
    ("W1 stacks on below memray run", "W1", "capsan, stacks on", "memray run", 1.0),
    ("W1d stacks on <= 1.45x plain", "W1d", "capsan, stacks on", "plain", 1.45),
    ("W1 stacks off <= 1.12x plain", "W1", "capsan, stacks off", "plain", 1.12),
    ("W2 stacks on <= 1.30x plain", "W2", "capsan, stacks on", "plain", 1.30),
    ("W2b stacks on <= 1.45x plain", "W2b", "capsan, stacks on", "plain", 1.45),
    ("W3 stacks on <= 1.35x plain", "W3", "capsan, stacks on", "plain", 1.35),
    ("W4 stream stacks on <= 1.25x plain", "W4s", "capsan, stacks on", "plain", 1.25),
    ("W4 round trip stacks on <= 1.20x plain", "W4r", "capsan, stacks on", "plain", 1.20),
]
# (issue 35) retired as below the floor: W2 stacks off <= 1.12x (floor 1.13x
# on Debian's stack), W4s and W4r <= 1.10x (floors 1.16x and 1.12x)


def venv_python(tag, listing="venvs.txt"):
    """The venv's python that `make venvs` (or `make arrow-venvs`) listed, or None."""
    try:
        with open(os.path.join(ROOT, "build", listing)) as f:
            for line in f:
                parts = line.split(None, 1)
                if len(parts) == 2 and parts[0] == tag:
                    return parts[1].strip()
    except OSError:
        pass
    return None


def py_info(py):
    """{numpy, torch, tvm_ffi, base, prefix, site} of an interpreter (None where missing)."""
    code = r"""
import json, sys, sysconfig
d = {"base": sys.base_prefix, "prefix": sys.prefix,
     "site": sorted({sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]}),
     "minor": "%d.%d" % sys.version_info[:2]}
import importlib.metadata as md, importlib.util as iu
for m, dist in (("numpy", "numpy"), ("torch", "torch"), ("tvm_ffi", "apache-tvm-ffi"),
                ("pyarrow", "pyarrow"), ("polars", "polars"), ("duckdb", "duckdb")):
    d[m] = None
    if iu.find_spec(m) is not None:
        try:  # the version without the import (torch takes seconds)
            d[m] = md.version(dist)
        except md.PackageNotFoundError:
            try:
                d[m] = __import__(m).__version__
            except Exception:
                pass
print(json.dumps(d))
"""
    out = subprocess.run([py, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                         text=True)
    return json.loads(out.stdout) if out.returncode == 0 else None


def memray_python(tag, py, info):
    """A python with memray (pinned) that runs the same interpreter as py
    and sees the same numpy and torch: a private venv under MEMRAY_VENVS,
    made once. For a system python, a --system-site-packages venv; for a
    venv, one made from its base interpreter with a .pth that adds the
    venv's site directories after its own. (python, None) or (None, why)."""
    d = os.path.join(MEMRAY_VENVS, tag)
    vpy = os.path.join(d, "bin", "python")
    stamp = os.path.join(d, ".capsan-bench")
    want = f"{MEMRAY} {py}"
    try:
        with open(stamp) as f:
            if f.read() == want and subprocess.run(
                    [vpy, "-c", "import memray, numpy"], stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL).returncode == 0:
                return vpy, None
    except OSError:
        pass
    print(f"  (making {d}: a venv with {MEMRAY} for {py}, once)", flush=True)
    shutil.rmtree(d, ignore_errors=True)
    if info["prefix"] == info["base"]:
        mk = [py, "-m", "venv", "--system-site-packages", d]
    else:
        base = os.path.join(info["base"], "bin", "python" + info["minor"])
        mk = [base, "-m", "venv", d]
    r = subprocess.run(mk, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if r.returncode != 0:
        return None, f"venv failed: {r.stdout.strip().splitlines()[-1:]}"
    if info["prefix"] != info["base"]:
        own = py_info(vpy)["site"][0]
        with open(os.path.join(own, "zz-capsan-bench-stack.pth"), "w") as f:
            f.write("import site; " + "; ".join(f"site.addsitedir({s!r})" for s in info["site"])
                    + "\n")
    r = subprocess.run([vpy, "-m", "pip", "install", "-q", "--disable-pip-version-check", MEMRAY],
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if r.returncode != 0:
        errs = [ln for ln in r.stdout.splitlines() if "ERROR" in ln] or r.stdout.splitlines()
        return None, f"pip install {MEMRAY} failed: {errs[-1] if errs else r.returncode}"
    vi = py_info(vpy)
    if not vi or (vi["numpy"], vi["torch"]) != (info["numpy"], info["torch"]):
        return None, f"its venv does not see the same numpy and torch ({vi})"
    with open(stamp, "w") as f:
        f.write(want)
    return vpy, None


def totals(out):
    """The Ir total of a callgrind output file."""
    with open(out) as f:
        for line in f:
            if line.startswith(("totals:", "summary:")):
                return int(line.split()[1])
    raise SystemExit(f"no totals in {out}")


def trace_summary(d):
    """(events, errors) capsan's trace(s) in d summed, or None without a trace."""
    traces = [os.path.join(d, t) for t in os.listdir(d) if t.startswith("t.")
              and not t.endswith(".json")]
    if not traces:
        return None
    out = subprocess.run([CAPSAN, "report", "--format", "json", *traces], check=True,
                         stdout=subprocess.PIPE, text=True).stdout
    procs = json.loads(out)["processes"]
    return (sum(p["summary"]["events"] for p in procs),
            sum(p["summary"]["errors"] for p in procs))


def one_run(job):
    """One callgrind run: fills in the job's loop and exit counts (the part
    dumped at loop end, and the rest up to the end of the process), the
    events capsan saw, and the run's seconds."""
    py, mpy, script, iters, kind, opt, d = (job[k] for k in
                                            ("py", "mpy", "script", "iters", "kind", "opt", "dir"))
    os.makedirs(d, exist_ok=True)
    out = os.path.join(d, "callgrind.out")
    env = dict(os.environ, BENCH_CG_MARK=MARK_SO, PYTHONHASHSEED="0")
    for k in ("LD_PRELOAD", "CAPSAN_OPTIONS", "PYTHONTRACEMALLOC"):
        env.pop(k, None)
    argv = [py, script, *job["args"], str(iters * job["per_iter"])]
    if kind in ("capsan", "floor"):
        env["LD_PRELOAD"] = LIB if kind == "capsan" else FLOOR_LIB
        env["CAPSAN_OPTIONS"] = f"log_path={d}/t:keep_trace=always:exitcode=0" + (":" + opt if opt else "")
    elif kind == "memray":
        argv = [mpy, "-m", "memray", "run", "-q", "-f", "-o", os.path.join(d, "memray.bin"),
                *opt, script, *job["args"], str(iters * job["per_iter"])]
    cmd = ["valgrind", "--tool=callgrind", "--instr-atstart=no", "--trace-children=no",
           "--dump-instr=no", f"--callgrind-out-file={out}", *argv]
    t0 = time.perf_counter()
    r = subprocess.run(cmd, env=env, cwd=d, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                       text=True)
    job["seconds"] = time.perf_counter() - t0
    if VERBOSE:
        print(f"    {job['seconds']:5.1f}s  {job['stack']} {job['workload']} {job['config']} "
              f"N={job['iters']}", flush=True)
    if r.returncode == SKIP:
        job["skip"] = r.stderr.strip().splitlines()[-1]
        return job
    if r.returncode != 0:
        tail = "\n".join(r.stderr.strip().splitlines()[-15:])
        raise SystemExit(f"callgrind run failed ({r.returncode}): {' '.join(cmd)}\n{tail}")
    if not os.path.exists(out + ".1"):
        raise SystemExit(f"no loop-end dump ({out}.1): the workload never reached "
                         f"loopmark.loop_ends() ({' '.join(cmd)})")
    job["loop"], job["exit"] = totals(out + ".1"), totals(out)
    if job["loop"] == 0 and iters:
        raise SystemExit(f"callgrind counted nothing in the loop: the loop-start mark was "
                         f"not reached ({' '.join(cmd)})")
    job["total"] = job["loop"] + job["exit"]
    job["out"] = out + ".1"
    if kind == "capsan":
        job["trace"] = trace_summary(d)
        if job["trace"] is None and not FLOOR:
            raise SystemExit(f"capsan wrote no trace under callgrind: {' '.join(cmd)}")
    if kind == "memray":
        m = os.path.join(d, "memray.bin")
        if not os.path.exists(m) or os.path.getsize(m) == 0:
            raise SystemExit(f"memray wrote no capture: {' '.join(cmd)}")
    return job


def collect_profile(out):
    """{"file:function": [self Ir, inclusive Ir]} for the functions of
    libcapsan.so in a callgrind output file (its name-compressed format:
    ob=, fl=, fn=, cob=, cfn=, calls= lines; a cost line after calls= is
    the callee's inclusive cost). The same sums as callgrind_annotate's."""
    names = {"ob": {}, "fn": {}, "fl": {}}
    cur_ob = cur_fn = cur_fl = None
    call_ob = call_fn = None
    in_call = False
    prof = {}

    def name(kind, val):
        val = val.strip()
        if val.startswith("("):
            i = val.index(")")
            key, rest = val[1:i], val[i + 1:].strip()
            if rest:
                names[kind][key] = rest
            return names[kind].get(key, key)
        return val

    with open(out) as f:
        for line in f:
            if not line or line[0] == "#" or line == "\n":
                continue
            c = line[0]
            if c.isdigit() or c in "+-*":
                tok = line.split()
                cost = int(tok[1]) if len(tok) > 1 else 0
                mine = cur_ob is not None and cur_ob.endswith("libcapsan.so")
                if in_call:
                    in_call = False
                    if mine and not (call_fn == cur_fn and call_ob == cur_ob):
                        prof.setdefault(key_fn, [0, 0])[1] += cost
                    call_ob = None  # a cob= holds for one call
                    continue
                if mine:
                    e = prof.setdefault(key_fn, [0, 0])
                    e[0] += cost
                    e[1] += cost
                continue
            key, _, val = line.partition("=")
            if key == "ob":
                cur_ob = name("ob", val)
            elif key == "fl":
                cur_fl = name("fl", val)
            elif key in ("fi", "fe", "cfi", "cfl"):
                name("fl", val)  # the same table of file names
            elif key == "fn":
                cur_fn = name("fn", val)
                fl = os.path.relpath(cur_fl, ROOT) if cur_fl and cur_fl.startswith(ROOT) else cur_fl
                key_fn = cur_fn if fl in (None, "???") else f"{fl}:{cur_fn}"
            elif key == "cob":
                call_ob = name("ob", val)
            elif key == "cfn":
                call_fn = name("fn", val)
            elif key == "calls":
                in_call = True
                if call_ob is None:
                    call_ob = cur_ob
    return prof


def print_profile(label, job_n, iters, whole):
    """The 15 costliest libcapsan.so functions per iteration, exclusive and
    inclusive (callees outside libcapsan.so included: a hook's inclusive
    cost holds the original function it calls). A function whose inclusive
    cost is most of the whole iteration (main_wrap, under which the
    program's main runs) is left out of the inclusive list."""
    per = {fn: [v[0] / iters, v[1] / iters] for fn, v in collect_profile(job_n["out"]).items()}
    total_self = sum(v[0] for v in per.values())
    print(f"  {label}: {whole:,.0f} instructions per iteration, {total_self:,.0f} of them "
          f"in libcapsan.so's own code")
    for col, what in ((0, "exclusive"), (1, "inclusive")):
        rows = sorted(per.items(), key=lambda kv: -kv[1][col])
        if col == 1:
            left = [fn for fn, v in rows if v[1] > 0.9 * whole]
            rows = [r for r in rows if r[0] not in left]
            what += f" (left out, the whole program runs under it: {', '.join(left) or '-'})"
        print(f"    top 15 by {what}:")
        for fn, v in rows[:15]:
            print(f"      {v[col]:9,.0f}  (self {v[0]:7,.0f})  {fn}")


def main():
    t_start = time.perf_counter()
    jobs_n = int(os.environ.get("BENCH_CG_JOBS", str(os.cpu_count() or 1)))
    quick = os.environ.get("BENCH_CG_QUICK", "0") == "1"
    memray_on = os.environ.get("BENCH_CG_MEMRAY", "1") == "1"
    zero = not quick
    profile = os.environ.get("BENCH_CG_PROFILE", "0") == "1"
    if shutil.which("valgrind") is None:
        print("Instruction counts: skipped, no valgrind (apt-get install valgrind)")
        return
    os.makedirs(os.path.dirname(MARK_SO), exist_ok=True)
    subprocess.run(["cc", "-O2", "-fPIC", "-shared", "-Wall", "-Wextra", "-Werror", "-o", MARK_SO,
                    os.path.join(BENCH, "cgmark.c")], check=True)
    iters = {w: int(os.environ.get("BENCH_CG_ITERS", str(spec[3])))
             for w, spec in WORKLOADS.items()}
    how = ("(count with N - count with 0) / N, counted from the loop's start to the end "
           "of the process" if zero else
           "the loop's own count / N (quick: no 0-iteration runs; make bench has them)")
    print(f"Instructions per loop iteration under callgrind: {how}; all threads; "
          f"N = " + ", ".join(f"{n:,} ({w})" for w, n in iters.items()) +
          f"; capsan {LIB}", flush=True)

    stacks = [("Debian", "/usr/bin/python3")]
    cur = venv_python("cp311")
    if cur:
        stacks.append(("cp311", cur))
    else:
        print("  cp311: skipped, no cp311 venv (make venvs)")
    arrow = venv_python("cp311", "arrowvenvs.txt")
    if arrow:
        stacks.append(("arrow", arrow))
    else:
        print("  W4: skipped, no Arrow venv (make arrow-venvs)")
    tmp = tempfile.mkdtemp(prefix="capsan-bench-cg-")
    jobs, notes, infos = [], [], {}
    try:
        for sname, py in stacks:
            if ONLY_STACKS and sname not in ONLY_STACKS:
                continue
            info = py_info(py)
            if info is None or info["numpy"] is None:
                notes.append(f"{sname}: skipped, {py} has no numpy")
                continue
            infos[sname] = info
            mpy = None
            if memray_on and sname != "arrow":  # W4 runs without memray
                mpy, why = memray_python(sname.lower(), py, info)
                if mpy is None:
                    notes.append(f"{sname}: memray skipped ({why})")
            for w, (script, _, per_iter, _) in WORKLOADS.items():
                if ONLY_WORKLOADS and w not in ONLY_WORKLOADS:
                    continue
                if (w in ARROW_ONLY) != (sname == "arrow"):
                    continue  # the Arrow stack runs W4 only, and only it does
                if w in ARROW_ONLY:
                    pass
                elif w not in ("W1", "W1d") and info["torch"] is None:
                    notes.append(f"{sname} {w}: skipped, no torch in {py}")
                    continue
                if w == "W3" and info["tvm_ffi"] is None:
                    notes.append(f"{sname} W3: skipped, no tvm_ffi in {py} (apache-tvm-ffi: "
                                 f"the cp311 venv of make venvs has it)")
                    continue
                for cname, kind, opt in CONFIGS:
                    if kind == "floor" and (not FLOOR_LIB or FLOOR):
                        continue
                    if kind == "memray" and (mpy is None or w == "W3" or w in ARROW_ONLY or
                                             (quick and (w != "W1" or opt))):
                        continue
                    if quick and (w == "W3" or w in ARROW_ONLY) and opt:
                        continue  # W3's and W4's targets are for stacks on
                    for n in ((iters[w], 0) if zero else (iters[w],)):
                        jobs.append(dict(stack=sname, workload=w, config=cname, kind=kind,
                                         opt=opt, py=py, mpy=mpy, per_iter=per_iter,
                                         script=os.path.join(BENCH, script.split()[0]),
                                         args=script.split()[1:], iters=n,
                                         dir=os.path.join(tmp, f"{sname}-{w}-{len(jobs)}")))
        # the torch workloads first: their start-up is the long part
        jobs.sort(key=lambda j: j["workload"] == "W1")
        print(f"  {len(jobs)} callgrind runs, {jobs_n} at a time ...", flush=True)
        with concurrent.futures.ThreadPoolExecutor(max_workers=jobs_n) as ex:
            done = list(ex.map(one_run, jobs))
        res = {(j["stack"], j["workload"], j["config"], j["iters"]): j for j in done}
        per, ev_of = {}, {}
        for sname, info in infos.items():
            for w, (_, what, _, _) in WORKLOADS.items():
                n = iters[w]
                rows = [(c, res.get((sname, w, c, n)), res.get((sname, w, c, 0)))
                        for c, _, _ in CONFIGS]
                rows = [r for r in rows if r[1] is not None]
                if not rows:
                    continue
                if any("skip" in r[1] for r in rows):
                    notes.append(f"{sname} {w}: {rows[0][1].get('skip', 'skipped')}")
                    continue
                versions = f"numpy {info['numpy']}" + (
                    f", torch {info['torch']}" if w not in ("W1", "W1d", *ARROW_ONLY) else "") + (
                    f", tvm_ffi {info['tvm_ffi']}" if w == "W3" else "") + (
                    f", pyarrow {info['pyarrow']}, polars {info['polars']}, duckdb "
                    f"{info['duckdb']}" if w in ARROW_ONLY else "")
                print(f"{w} {what}; {sname}: {versions}")
                for c, jn, j0 in rows:
                    per[(sname, w, c)] = ((jn["total"] - j0["total"]) / n if j0
                                          else jn["loop"] / n)
                base = per[(sname, w, "plain")]
                mem = per.get((sname, w, "memray run"))
                for c, jn, j0 in rows:
                    v = per[(sname, w, c)]
                    cells = f"  {c:22s} {v:10,.0f} instr/iter"
                    cells += f"  {v / base:5.2f}x plain" if c != "plain" else " " * 13
                    cells += f"  {v / mem:5.2f}x memray" if c.startswith("capsan") and mem else ""
                    if jn.get("trace"):
                        ev = jn["trace"][0] - (j0["trace"][0] if j0 else 0)
                        cells += (f"  capsan saw {ev / n:.1f} events/iter"
                                  + (f", {jn['trace'][1]} errors" if jn["trace"][1] else ""))
                    if j0:
                        # what the exit added per iteration: 0 unless a cost at
                        # exit grows with N (then the loop-only figure would miss it)
                        grew = (jn["exit"] - j0["total"]) / n
                        if abs(grew) >= 0.005 * v:
                            cells += f"  (the exit grew {grew:+,.0f} instr/iter)"
                    print(cells)
                fl, cap = per.get((sname, w, "floor")), per.get((sname, w, "capsan, stacks on"))
                jc = res.get((sname, w, "capsan, stacks on", n))
                if fl is not None and cap is not None and cap > base:
                    ev = None
                    if jc and jc.get("trace"):
                        j0c = res.get((sname, w, "capsan, stacks on", 0))
                        ev = (jc["trace"][0] - (j0c["trace"][0] if j0c else 0)) / n
                    if w == "W5" and ev_of.get((sname, "W2")):
                        ev = ev_of[(sname, "W2")]  # its own count holds the 20,000 set up first
                    ev_of[(sname, w)] = ev
                    above = cap - fl
                    line = (f"  floor {fl / base:.2f}x, capsan {cap / base:.2f}x: the floor is "
                            f"{(fl - base) / (cap - base):.0%} of what capsan adds; above it "
                            f"{above:,.0f} instr/iter")
                    if ev:
                        line += f", {above / ev:,.0f} an event ({ev:.1f} events/iter)"
                    print(line)
        for n in notes:
            print(f"  note: {n}")
        print("Targets by instruction count (issue 35), on each stack:")
        for label, w, c, against, limit in TARGETS:
            cells, worst = [], None
            for sname in infos:
                a, b = per.get((sname, w, c)), per.get((sname, w, against))
                if a is None or b is None:
                    continue
                r = a / b
                cells.append(f"{sname} {r:.2f}x")
                worst = r if worst is None else max(worst, r)
            if worst is None:
                print(f"  {label:38s} not measured")
                continue
            ok = worst < limit if against != "plain" else worst <= limit
            print(f"  {label:38s} {'   '.join(cells):30s} {'met' if ok else 'NOT met'}")
        # W5: what capsan adds to an event with 20,000 objects alive, against
        # what it adds to the same loop with none (W2): within 5%
        for c in ("capsan, stacks on", "capsan, stacks off"):
            cells, worst = [], None
            for sname in infos:
                k = [per.get((sname, w, x)) for w in ("W5", "W2") for x in (c, "plain")]
                if None in k or k[2] == k[3]:
                    continue
                r = (k[0] - k[1]) / (k[2] - k[3])
                cells.append(f"{sname} {r:.2f}x")
                worst = r if worst is None else max(worst, r)
            label = f"W5 added cost / W2's <= 1.05 ({c[8:]})"
            if worst is None:
                print(f"  {label:38s} not measured")
            else:
                print(f"  {label:38s} {'   '.join(cells):30s} {'met' if worst <= 1.05 else 'NOT met'}")
        if profile:
            print("Where capsan's instructions go (stacks on; the loop's counts / N, by function "
                  "of libcapsan.so):")
            for sname in infos:
                for w in ("W1", "W1d", "W2", "W2b", "W5", "W3"):
                    jn = res.get((sname, w, "capsan, stacks on", iters[w]))
                    if jn and "out" in jn:
                        print_profile(f"{w} {sname}", jn, iters[w],
                                      per[(sname, w, "capsan, stacks on")])
    finally:
        if os.environ.get("BENCH_CG_KEEP", "0") == "1":
            print(f"  (callgrind outputs kept in {tmp})")
        else:
            shutil.rmtree(tmp, ignore_errors=True)
    wall = time.perf_counter() - t_start
    cpu = sum(j["seconds"] for j in jobs) if jobs else 0
    print(f"  (instruction counts took {wall:.0f}s: {len(jobs)} callgrind runs, "
          f"{cpu:.0f}s of run time)")


if __name__ == "__main__":
    main()
