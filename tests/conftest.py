"""Shared helpers for capsan's pytest suites.

Everything runs as subprocesses against the artefacts `make` builds into
build/: the runtime (build/lib/libcapsan.so), the CLI (build/bin/capsan), the
fixture extensions (build/tests/*.so, importable with build/tests on
PYTHONPATH) and the shared-libpython interpreter (build/tests/pyshared).

    res = run_capsan(SCENARIOS / "dl_leak.py", tmp_path, args=["consumed"])
    rc, stderr, report = res          # also res.stdout, res.traces, res.cmd

Tests import the helpers with `from conftest import ...` (pytest puts this
directory on sys.path).
"""
from __future__ import annotations

import atexit
import ctypes
import json
import os
import re
import resource
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent
ROOT = TESTS.parent
BUILD = ROOT / "build"
CAPSAN = BUILD / "bin" / "capsan"
LIBCAPSAN = BUILD / "lib" / "libcapsan.so"
FIXDIR = BUILD / "tests"
PYSHARED = FIXDIR / "pyshared"
STATIC_PY = Path("/usr/bin/python3")  # Debian's python3.11, libpython linked statically
SCENARIOS = TESTS / "scenarios"
KINDS_INC = ROOT / "model" / "kinds.inc"
OPTIONS_INC = ROOT / "model" / "options.inc"

DEFAULT_EXITCODE = 23
TIMEOUT = 120

# The two interpreter builds capsan must serve (DESIGN.md, "Facts").
INTERPRETERS = {"static": STATIC_PY, "shared": PYSHARED}


def tagged_pythons(listing: str) -> dict:
    """{TAG: PYTHON} from a build/ listing of "TAG PYTHON" lines."""
    out = {}
    txt = BUILD / listing
    if txt.exists():
        for line in txt.read_text().splitlines():
            parts = line.split(None, 1)
            if len(parts) == 2:
                out[parts[0]] = Path(parts[1])
    return out


# {"cp310": PYTHON, ...}: the venvs `make venvs` built (.ci/venvs), each a
# pyenv CPython (shared libpython) with numpy 2; cp311 also has torch 2.13,
# JAX and tvm-ffi. Their fixtures are in build/tests/TAG.
CURRENT = tagged_pythons("venvs.txt")
# every interpreter the machine has: Debian's two builds, then the venvs
ALL_PYTHONS = {**INTERPRETERS, **CURRENT}


@dataclass(frozen=True)
class Newest:
    """One of the newest CPythons (.ci/newest, build/newest.txt): 3.14 and
    3.15 in Debian unstable's chroot, where capsan is built into build/sid
    by that release's gcc, or the free-threaded 3.13t on the host. The
    checkout and /tmp are the same paths inside the chroot as outside."""
    tag: str
    root: Path | None  # the chroot, None on the host
    python: Path       # as seen inside root
    build: Path

    @property
    def capsan(self) -> Path:
        return self.build / "bin" / "capsan"

    @property
    def lib(self) -> Path:
        return self.build / "lib" / "libcapsan.so"

    @property
    def fixdir(self) -> Path:
        return self.build / "tests" / self.tag

    @property
    def pydir(self) -> Path:
        """the capsan package built for it (build/python: `import capsan`)"""
        return self.build / "python"

    @property
    def free_threaded(self) -> bool:
        return self.tag.endswith("t")

    def command(self, argv: list, env: dict, cwd=None) -> tuple[list, dict]:
        """argv and env to run argv with env in this interpreter's world
        (in cwd: chroot starts at its root)"""
        if self.root is None:
            env = {**env, "PATH": f"{self.python.parent}:{env.get('PATH', '/usr/bin:/bin')}"}
            return [str(a) for a in argv], env
        keep = {k: v for k, v in env.items()
                if k.startswith(("CAPSAN", "PYTHON", "LD_PRELOAD", "OMP_", "PYTEST"))}
        # the venv's own tools first (meson and ninja for numpy's suites)
        keep.update(PATH=f"{self.python.parent}:/usr/local/bin:/usr/bin:/bin", HOME="/root",
                    LANG="C.UTF-8")
        return [shutil.which("chroot", path="/usr/sbin:/sbin:/usr/bin:/bin") or "chroot",
                str(self.root), "/usr/bin/env", "-i", *(["-C", str(cwd)] if cwd else []),
                *[f"{k}={v}" for k, v in keep.items()], *map(str, argv)], keep


def newest_pythons() -> dict:
    out = {}
    txt = BUILD / "newest.txt"
    if txt.exists():
        for line in txt.read_text().splitlines():
            parts = line.split()
            if len(parts) == 4:
                tag, root, py, build = parts
                out[tag] = Newest(tag, None if root == "-" else Path(root), Path(py),
                                  ROOT / build)
    return out


# {"cp314": Newest, "cp315": ..., "cp313t": ...}: what `make newest` readied
NEWEST = newest_pythons()
NEWEST_TAGS = ["cp314", "cp315", "cp313t"]


def newest_python(tag: str) -> Newest:
    """The newest interpreter `tag`, its capsan and fixtures built; skip
    when this machine could not have it (.ci/newest says why)."""
    if tag not in NEWEST:
        pytest.skip(f"no {tag} on this machine (make newest; .ci/newest)")
    n = NEWEST[tag]
    require(n.capsan, n.lib, n.fixdir / "dlconsumer.so")
    return n


def fixdir_for(interpreter) -> Path:
    """Where the fixture extensions built for `interpreter` are."""
    for tag, py in CURRENT.items():
        if interpreter is not None and Path(interpreter) == py:
            return FIXDIR / tag
    return FIXDIR


def current_python(tag: str) -> Path:
    """A current-stack venv's python, its fixtures built; skip when this
    machine has no such CPython (.ci/venvs says which it found)."""
    if tag not in CURRENT:
        pytest.skip(f"no {tag} venv on this machine (make venvs; .ci/venvs)")
    require(CURRENT[tag], fixdir_for(CURRENT[tag]) / "dlconsumer.so")
    return CURRENT[tag]


def require(*paths: Path) -> None:
    """Fail (never skip) when a build artefact is missing."""
    missing = [str(p) for p in paths if not Path(p).exists()]
    if missing:
        pytest.fail(
            "capsan build artefact(s) missing: " + ", ".join(missing)
            + " -- run `make && make fixtures` in " + str(ROOT),
            pytrace=False,
        )


def require_fixtures() -> None:
    require(FIXDIR / "dlproducer.so", FIXDIR / "dlconsumer.so", PYSHARED)


def require_runtime() -> None:
    require(CAPSAN, LIBCAPSAN)
    require_fixtures()


def contract_kinds() -> list[tuple[str, str]]:
    """(name, severity) of every KIND(...) in model/kinds.inc."""
    text = KINDS_INC.read_text()
    out = []
    for m in re.finditer(r'KIND\(\s*\w+\s*,\s*"([^"]+)"\s*,\s*CS_SEV_(\w+)', text):
        out.append((m.group(1), m.group(2).lower()))
    assert out, "no KIND() lines parsed from kinds.inc"
    return out


def contract_options() -> list[str]:
    """Every option name in model/options.inc."""
    names = re.findall(r"^OPT\(\s*\w+\s*,\s*(\w+)\s*,", OPTIONS_INC.read_text(), re.M)
    assert names, "no OPT() lines parsed from options.inc"
    return names


def marker_line(script: Path, tag: str) -> int:
    """Line number of the unique line carrying the comment `# <-- tag`."""
    pat = re.compile(r"#\s*<--\s*" + re.escape(tag) + r"\s*$")
    hits = [i for i, line in enumerate(Path(script).read_text().splitlines(), 1)
            if pat.search(line)]
    assert len(hits) == 1, f"marker '# <-- {tag}' found {len(hits)} times in {script}"
    return hits[0]


def is_signal(rc: int, sig: int) -> bool:
    """A death by `sig`, seen directly (-sig) or through a shell/launcher (128+sig)."""
    return rc in (-sig, 128 + sig)


def no_core():
    """preexec_fn: crashing scenarios must not leave core files behind."""
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))


API_TRACES = Path(tempfile.mkdtemp(prefix="capsan-api-traces-"))
atexit.register(shutil.rmtree, API_TRACES, True)


def base_env(extra: dict | None = None, interpreter=None) -> dict:
    env = dict(os.environ)
    for k in ("LD_PRELOAD", "CAPSAN_OPTIONS", "PYTHONHOME", "PYTHONSTARTUP", "VIRTUAL_ENV"):
        env.pop(k, None)
    env["PYTHONPATH"] = str(fixdir_for(interpreter))
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    env["OMP_NUM_THREADS"] = "1"  # keep torch from spawning a thread pool per process
    # a program that starts capsan itself (`import capsan`) with no options
    # of its own writes its trace under the session's temporary directory,
    # never into the working directory (tests/)
    env["CAPSAN_OPTIONS"] = f"log_path={API_TRACES / 'capsan.trace'}"
    if extra:
        env.update(extra)
    return env


@dataclass
class Result:
    returncode: int
    stdout: str
    stderr: str
    report: dict | None
    traces: list = field(default_factory=list)
    cmd: list = field(default_factory=list)
    report_stderr: str = ""

    def __iter__(self):  # rc, stderr, report = run_capsan(...)
        return iter((self.returncode, self.stderr, self.report))

    def describe(self) -> str:
        return (f"command: {' '.join(map(str, self.cmd))}\nreturncode: {self.returncode}\n"
                f"--- stdout ---\n{self.stdout[-3000:]}\n--- stderr ---\n{self.stderr[-6000:]}\n"
                f"--- report stderr ---\n{self.report_stderr[-2000:]}\n"
                f"--- findings ---\n{summarize(self.report)}")


def trace_files(tmp: Path, prefix: str = "t") -> list[Path]:
    """Trace files log_path.PID (not log_path.PID.json or other siblings)."""
    pat = re.compile(re.escape(prefix) + r"\.\d+")
    return sorted(p for p in Path(tmp).iterdir() if pat.fullmatch(p.name))


def capsan_report(traces, fmt: str = "json", extra_args=()):
    """Run `capsan report --format FMT TRACE...`; return (CompletedProcess, parsed or None)."""
    require(CAPSAN)
    cmd = [str(CAPSAN), "report", "--format", fmt, *map(str, extra_args), *map(str, traces)]
    cp = subprocess.run(cmd, capture_output=True, text=True, timeout=TIMEOUT)
    parsed = None
    if fmt == "json":
        assert cp.returncode == 0, f"`{' '.join(cmd)}` failed ({cp.returncode}):\n{cp.stderr}"
        try:
            parsed = json.loads(cp.stdout)
        except json.JSONDecodeError as e:
            raise AssertionError(f"capsan report did not print JSON ({e}):\n{cp.stdout[:2000]}")
        check_schema(parsed)
    return cp, parsed


def script_path(script, tmp: Path, stem: str) -> Path:
    """A script given as source text is written to tmp/STEM_N.py (tmp is
    created); a path is returned as it is."""
    tmp.mkdir(parents=True, exist_ok=True)
    if isinstance(script, str):
        path = tmp / f"{stem}_{len(list(tmp.glob(stem + '_*.py')))}.py"
        path.write_text(script)
        return path
    return Path(script)


def run_capsan(script, tmp: Path, *, options=None, interpreter=STATIC_PY, mode: str = "run",
               args=(), env=None, timeout: int = TIMEOUT, stdin=None, lib=None) -> Result:
    """Run a Python script (a Path, or source code as a str) under capsan.

    mode="run":     build/bin/capsan run --log-path TMP/t -- INTERP SCRIPT ARGS
                    (options go through CAPSAN_OPTIONS)
    mode="preload": LD_PRELOAD=build/lib/libcapsan.so (or lib) CAPSAN_OPTIONS=log_path=TMP/t:OPTIONS
    Then every trace TMP/t.PID is replayed by `capsan report --format json`.
    """
    require_runtime()
    require(Path(interpreter))
    tmp = Path(tmp)
    script = script_path(script, tmp, "prog")
    prefix = tmp / "t"
    opts = list(options or [])
    if isinstance(options, str):
        opts = [options] if options else []
    e = base_env(env, interpreter)
    argv = [str(interpreter), str(script), *map(str, args)]
    if mode == "run":
        # every trace is kept: tests read clean runs' traces too
        cmd = [str(CAPSAN), "run", "--keep-trace", "--log-path", str(prefix), "--", *argv]
        if opts:
            e["CAPSAN_OPTIONS"] = ":".join(opts)
    elif mode == "preload":
        cmd = argv
        e["LD_PRELOAD"] = str(lib or LIBCAPSAN)
        e["CAPSAN_OPTIONS"] = ":".join([f"log_path={prefix}", "keep_trace=always", *opts])
    else:
        raise ValueError(mode)
    return run_and_read(cmd, tmp, env=e, timeout=timeout,
                        stdin=stdin if stdin is not None else subprocess.DEVNULL)


def run_and_read(cmd: list, tmp: Path, *, env: dict, timeout: int, stdin=subprocess.DEVNULL,
                 cwd=None) -> Result:
    """Run cmd, then replay every trace TMP/t.PID it left with `capsan
    report --format json`."""
    cp = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env,
                        stdin=stdin, preexec_fn=no_core, cwd=cwd)
    traces = trace_files(tmp)
    report, rep_err = None, ""
    if traces:
        rcp, report = capsan_report(traces)
        rep_err = rcp.stderr
    return Result(cp.returncode, cp.stdout, cp.stderr, report, traces, cmd, rep_err)


def run_newest(n: Newest, script, tmp: Path, *, options=None, mode: str = "run", args=(),
               env=None, timeout: int = TIMEOUT, argv=None) -> Result:
    """run_capsan for one of the newest interpreters: its own capsan build,
    in its chroot where it has one; the traces are read by this build's
    `capsan report`. argv replaces `PYTHON SCRIPT ARGS` when given."""
    tmp = Path(tmp)
    prefix = tmp / "t"
    tmp.mkdir(parents=True, exist_ok=True)
    if argv is None:
        script = script_path(script, tmp, "prog")
        argv = [n.python, script, *args]
    opts = [options] if isinstance(options, str) else list(options or [])
    e = base_env(env)
    e["PYTHONPATH"] = f"{n.fixdir}:{n.pydir}" + (f":{env['PYTHONPATH']}"
                                                 if env and "PYTHONPATH" in env else "")
    if mode == "run":
        cmd = [n.capsan, "run", "--keep-trace", "--log-path", prefix, "--", *argv]
        if opts:
            e["CAPSAN_OPTIONS"] = ":".join(opts)
    elif mode == "preload":
        cmd = list(argv)
        e["LD_PRELOAD"] = str(n.lib)
        e["CAPSAN_OPTIONS"] = ":".join([f"log_path={prefix}", "keep_trace=always", *opts])
    elif mode == "plain":
        cmd = list(argv)
        e["CAPSAN_OPTIONS"] = ":".join([f"log_path={prefix}", *opts])
    else:
        raise ValueError(mode)
    cmd, e = n.command(cmd, e, tmp)
    return run_and_read(cmd, tmp, env=e, timeout=timeout, cwd=str(tmp))


def run_plain(script, *, interpreter=STATIC_PY, args=(), env=None, timeout: int = TIMEOUT):
    """The same script without capsan (for comparisons)."""
    require_fixtures()
    return subprocess.run([str(interpreter), str(script), *map(str, args)], capture_output=True,
                          text=True, timeout=timeout, env=base_env(env, interpreter),
                          stdin=subprocess.DEVNULL, preexec_fn=no_core)


# ---- the JSON report ----

def check_schema(rep: dict) -> None:
    """The fields DESIGN.md says must exist."""
    assert rep.get("tool") == "capsan", rep.get("tool")
    assert rep.get("format") == 1, rep.get("format")
    assert isinstance(rep.get("processes"), list)
    for p in rep["processes"]:
        for k in ("pid", "ppid", "argv", "ended", "status", "findings", "summary"):
            assert k in p, f"process lacks {k!r}: {sorted(p)}"
        assert p["ended"] in ("exit", "_exit", "signal", "unknown"), p["ended"]
        for k in ("errors", "warnings", "leaked_bytes", "events"):
            assert k in p["summary"], f"summary lacks {k!r}"
        for f in p["findings"]:
            for k in ("kind", "severity", "message", "object", "bytes", "events"):
                assert k in f, f"finding lacks {k!r}: {f}"
            assert f["severity"] in ("error", "warning"), f["severity"]
            assert {"type", "address"} <= set(f["object"]), f["object"]
            for ev in f["events"]:
                for k in ("event", "thread", "time_ns", "stack"):
                    assert k in ev, f"event lacks {k!r}: {ev}"
                for fr in ev["stack"]:
                    assert "python" in fr, fr
                    if fr["python"]:
                        assert {"file", "line", "function"} <= set(fr), fr


def parent_process(report: dict) -> dict:
    """the process that ran the script (a forked child has a higher pid)"""
    ps = report["processes"]
    assert ps, summarize(report)
    return min(ps, key=lambda p: p["pid"])


def assert_clean_with_child(res: "Result", survived: str, min_events: int) -> dict:
    """res printed `survived`, forked once, neither process found anything,
    and the parent exited 0 having judged at least min_events events.
    Returns the parent's record."""
    assert res.returncode == 0 and survived in res.stdout, res.describe()
    assert res.report is not None, res.describe()
    assert findings(res.report) == [], res.describe()
    assert len(res.report["processes"]) == 2, summarize(res.report)  # parent and child
    p = parent_process(res.report)
    assert p["ended"] == "exit" and p["status"] == 0, p
    assert p["summary"]["errors"] == 0 and p["summary"]["leaked_bytes"] == 0, p["summary"]
    assert p["summary"]["events"] >= min_events, p["summary"]
    return p


def findings(report: dict | None, kind: str | None = None, severity: str | None = None) -> list:
    if not report:
        return []
    out = []
    for p in report["processes"]:
        for f in p["findings"]:
            if (kind is None or f["kind"] == kind) and (severity is None or f["severity"] == severity):
                out.append(f)
    return out


def kinds(report) -> set:
    return {f["kind"] for f in findings(report)}


def summarize(report) -> str:
    if not report:
        return "(no report: no trace file)"
    lines = []
    for p in report["processes"]:
        lines.append(f"pid {p['pid']} ended={p['ended']} status={p['status']} summary={p['summary']}")
        for f in p["findings"]:
            locs = sorted({f"{ev['event']}@{Path(fr['file']).name}:{fr['line']}"
                           for ev in f["events"] for fr in ev["stack"][:50]
                           if fr.get("python") and fr.get("file")})
            lines.append(f"  {f['severity']} {f['kind']}: {f['message']}  [{', '.join(locs)}]")
    return "\n".join(lines)


def python_frames(event: dict) -> list:
    return [fr for fr in event["stack"] if fr.get("python")]


def events_at(finding: dict, script: Path, line: int, event: str | None = None) -> list:
    """Events of `finding` whose stack has a Python frame at script:line."""
    name = Path(script).name
    out = []
    for ev in finding["events"]:
        if event is not None and ev["event"] != event:
            continue
        for fr in python_frames(ev):
            if fr.get("file") and Path(fr["file"]).name == name and fr.get("line") == line:
                out.append(ev)
                break
    return out


def innermost_python(event: dict):
    fr = python_frames(event)
    return (Path(fr[0]["file"]).name, fr[0]["line"]) if fr else None


def assert_finding_at(res: Result, kind: str, script: Path, tag: str, event: str | None = None,
                      innermost: bool = True):
    """The report has `kind`, and one of its events happened at the line marked `# <-- tag`
    (with innermost=True that line must be the innermost Python frame of the event;
    otherwise any Python frame of its stack). Returns the finding."""
    line = marker_line(script, tag)
    fs = findings(res.report, kind)
    assert fs, f"no {kind} finding\n{res.describe()}"
    for f in fs:
        for ev in events_at(f, script, line, event):
            if not innermost or innermost_python(ev) == (Path(script).name, line):
                return f
    assert False, (f"{kind} found, but no {event or ''} event with innermost Python frame "
                   f"{Path(script).name}:{line} (# <-- {tag})\n{res.describe()}")


def assert_lsan_stderr(stderr: str, kind: str, severity: str = "error"):
    word = "ERROR" if severity == "error" else "WARNING"
    assert f"{word}: capsan:" in stderr, f"no '{word}: capsan:' line on stderr:\n{stderr[-4000:]}"
    assert kind in stderr, f"{kind} not named on stderr:\n{stderr[-4000:]}"
    assert "SUMMARY: capsan:" in stderr, f"no 'SUMMARY: capsan:' line on stderr:\n{stderr[-4000:]}"


def crash_reports(text: str) -> list[str]:
    """The crash reports capsan's handler wrote in `text`, each from its
    first line ("==PID==capsan: <signal> at pc 0x...") to its trace line."""
    out = []
    for m in re.finditer(r"^==(\d+)==capsan: .* at pc 0x[0-9a-f]+.*$", text, re.M):
        end = re.compile(rf"^=={m.group(1)}==capsan: (trace: |no trace).*$", re.M).search(text, m.end())
        out.append(text[m.start():end.end() if end else len(text)])
    return out


def check_crash_report(text: str, signame: str, pyframe: str) -> tuple[str, Path]:
    """`text` holds exactly one crash report: for signal SIG<signame>, with
    a native stack, the Python frame `pyframe` ("file.py:LINE in func"),
    and a `capsan report TRACE` command that renders the trace (the CLI
    beside the runtime, build/bin/capsan). Returns (report, trace)."""
    reps = crash_reports(text)
    assert len(reps) == 1, f"{len(reps)} crash reports in:\n{text[-6000:]}"
    rep = reps[0]
    assert re.search(rf"==\d+==capsan: SIG{signame}: ", rep), rep
    native = rep.split("native stack of the crashing thread:\n", 1)
    assert len(native) == 2 and re.match(r"    #0 0x[0-9a-f]+", native[1]), rep
    py = rep.split("Python stack of the crashing thread, innermost first:\n", 1)
    assert len(py) == 2 and re.search(rf"^    #\d+ \S*{re.escape(pyframe)}$", py[1], re.M), rep
    m = re.search(r"capsan: trace: (\S+); render it with: (.+)$", rep, re.M)
    assert m, rep
    cmd = shlex.split(m.group(2))
    trace = Path(m.group(1))
    assert cmd[1:] == ["report", str(trace)] and Path(cmd[0]).resolve() == CAPSAN.resolve(), cmd
    assert trace.is_absolute() and trace.is_file(), trace
    cp = subprocess.run(cmd, capture_output=True, text=True, timeout=TIMEOUT)
    assert cp.returncode == 0, cp.stderr
    assert f"ended: signal {getattr(signal, 'SIG' + signame).value} (SIG{signame})" in cp.stdout, \
        cp.stdout[-3000:]
    return rep, trace


def process_of(report: dict, pid: int | None = None) -> dict:
    ps = report["processes"]
    if pid is None:
        assert len(ps) == 1, f"expected one process, got {len(ps)}: {summarize(report)}"
        return ps[0]
    for p in ps:
        if p["pid"] == pid:
            return p
    raise AssertionError(f"no process {pid} in report: {summarize(report)}")


@pytest.fixture(params=sorted(INTERPRETERS), ids=lambda k: k)
def interp(request):
    """Both interpreter builds: Debian's static-libpython python3 and build/tests/pyshared."""
    return INTERPRETERS[request.param]


ALL_TAGS = ["static", "shared", "cp310", "cp311", "cp312", "cp313"]


@pytest.fixture(params=ALL_TAGS)
def anypy(request):
    """Every CPython the machine has: Debian's 3.11 (static and shared
    libpython, numpy 1.24, torch 1.13) and pyenv's 3.10-3.13 venvs (numpy 2)."""
    if request.param in INTERPRETERS:
        require_fixtures()
        return INTERPRETERS[request.param]
    return current_python(request.param)




# ---- the Arrow peer venvs (.ci/arrowvenvs: pyarrow, polars, duckdb, ...) ----

ARROW = tagged_pythons("arrowvenvs.txt")


@pytest.fixture(params=["cp311", "cp313"])
def apy_tag(request):
    """(python, tag) of the Arrow venv of CPython 3.11, then 3.13."""
    if request.param not in ARROW:
        pytest.skip(f"no Arrow {request.param} venv (make arrow-venvs; .ci/arrowvenvs)")
    return ARROW[request.param], request.param


@pytest.fixture
def apy(apy_tag):
    """The Arrow venv's python, for CPython 3.11 and 3.13."""
    return apy_tag[0]


# ---- a loaded machine (test_repeat.py, test_free_threaded.py, test_ft_stress.py) ----

def _die_with_parent():
    """A hog dies with the test process, however that ends (even SIGKILL)."""
    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    os.setsid()


@pytest.fixture(scope="module")
def hog():
    """A busy loop on every core beside the runs, killed at the end of the
    module (a failure and ^C included: the finalizer, and PDEATHSIG if the
    test process itself dies)."""
    procs = [subprocess.Popen([sys.executable, "-c", "while True: pass"],
                              stdin=subprocess.DEVNULL, preexec_fn=_die_with_parent)
             for _ in range(os.cpu_count() or 2)]
    try:
        yield procs
    finally:
        for p in procs:
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        for p in procs:
            p.wait()
