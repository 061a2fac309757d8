"""Test-side helpers for the NumPy suites (test_numpy_*.py,
test_pytest_plugin.py): run a scenario with the importable package
(`import capsan`, no preload) and read what it printed.

    r = run_api(SCENARIOS / "np_leak.py", tmp_path, args=["keep"])
    r.findings          # the finding dicts the scenario's trace printed (np_common.emit)
    assert_at(r.findings, "numpy-leak", script, "alloc-keep", event="alloc")

Every helper takes the interpreter (Debian's /usr/bin/python3 by default, or
a current-stack venv's python: conftest.current_python) and uses the
fixtures built for it (conftest.fixdir_for).
"""
from __future__ import annotations

import functools
import json
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from conftest import (BUILD, FIXDIR, STATIC_PY, TIMEOUT, base_env, fixdir_for, marker_line,
                      no_core, require, require_fixtures, script_path, trace_files)

PYDIR = BUILD / "python"
NP_FIXTURES = ["np_leaky", "np_foreign", "np_stalehandler", "np_badhandler", "np_aligned"]


def require_np(interpreter=STATIC_PY):
    require_fixtures()
    require(PYDIR / "capsan" / "__init__.py", BUILD / "lib" / "libcapsan.so",
            *(fixdir_for(interpreter) / f"{n}.so" for n in NP_FIXTURES))


def np_env(interpreter=STATIC_PY) -> dict:
    """env= for run_capsan / run_plain: the fixtures built for `interpreter`
    and build/python on PYTHONPATH."""
    return {"PYTHONPATH": f"{fixdir_for(interpreter)}:{PYDIR}"}


@functools.lru_cache(maxsize=None)
def numpy_version(interpreter=STATIC_PY) -> tuple:
    """(major, minor) of the numpy `interpreter` imports."""
    cp = subprocess.run([str(interpreter), "-c", "import numpy; print(numpy.__version__)"],
                        capture_output=True, text=True, timeout=TIMEOUT, env=base_env())
    assert cp.returncode == 0, cp.stderr
    return tuple(int(x) for x in cp.stdout.strip().split(".")[:2])


def api_env(tmp: Path, options=(), extra=None, interpreter=STATIC_PY) -> dict:
    e = base_env(extra)
    e["PYTHONPATH"] = f"{PYDIR}:{fixdir_for(interpreter)}"
    e["CAPSAN_OPTIONS"] = ":".join([f"log_path={Path(tmp) / 't'}", *options])
    if extra:
        e.update(extra)
    return e


@dataclass
class ApiResult:
    returncode: int
    stdout: str
    stderr: str
    findings: list | None
    reprs: list | None
    cmd: list = field(default_factory=list)
    traces: list = field(default_factory=list)

    def describe(self) -> str:
        return (f"command: {' '.join(map(str, self.cmd))}\nreturncode: {self.returncode}\n"
                f"--- stdout ---\n{self.stdout[-3000:]}\n--- stderr ---\n{self.stderr[-6000:]}\n"
                f"--- findings ---\n{summarize_list(self.findings)}")


def run_api(script, tmp: Path, *, args=(), options=(), interpreter=STATIC_PY, env=None,
            timeout=TIMEOUT) -> ApiResult:
    """Run `interpreter script args` with build/python and the interpreter's
    fixtures on PYTHONPATH, CAPSAN_OPTIONS=log_path=tmp/t:options, no preload."""
    require_np(interpreter)
    tmp = Path(tmp)
    script = script_path(script, tmp, "api")
    cmd = [str(interpreter), str(script), *map(str, args)]
    cp = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout,
                        env=api_env(tmp, options, env, interpreter), stdin=subprocess.DEVNULL,
                        preexec_fn=no_core, cwd=str(tmp))
    fs = reprs = None
    for line in cp.stdout.splitlines():
        if line.startswith("CAPSAN-FINDINGS "):
            fs = json.loads(line[len("CAPSAN-FINDINGS "):])
        elif line.startswith("CAPSAN-REPR "):
            reprs = json.loads(line[len("CAPSAN-REPR "):])
    return ApiResult(cp.returncode, cp.stdout, cp.stderr, fs, reprs, cmd, trace_files(tmp))


def summarize_list(fs) -> str:
    if fs is None:
        return "(the scenario printed no findings line)"
    out = []
    for f in fs:
        locs = sorted({f"{ev['event']}@{Path(fr['file']).name}:{fr['line']}"
                       for ev in f["events"] for fr in ev["stack"]
                       if fr.get("python") and fr.get("file")})
        out.append(f"  {f['severity']} {f['kind']}: {f['message']}  [{', '.join(locs)}]")
    return "\n".join(out) or "  (none)"


def script_line_of(event: dict, script: Path):
    """The line of the innermost frame of `script` in the event's stack."""
    name = Path(script).name
    for fr in event["stack"]:
        if fr.get("python") and fr.get("file") and Path(fr["file"]).name == name:
            return fr["line"]
    return None


def assert_at(findings_list, kind, script, tag, event=None, where=""):
    """A `kind` finding has an event (named `event`) whose innermost frame in
    `script` is the line marked `# <-- tag`. Returns that finding."""
    line = marker_line(script, tag)
    fs = [f for f in findings_list or [] if f["kind"] == kind]
    assert fs, f"no {kind} finding{where}\n{summarize_list(findings_list)}"
    for f in fs:
        for ev in f["events"]:
            if (event is None or ev["event"] == event) and script_line_of(ev, script) == line:
                return f
    raise AssertionError(f"{kind} found, but no {event or ''} event at {Path(script).name}:{line} "
                         f"(# <-- {tag}){where}\n{summarize_list(findings_list)}")
