"""numpy's own NEP 49 and DLPack suites, test_mem_policy.py and
test_dlpack.py as the installed numpy ships them, run with capsan active:
numpy 1.24 (Debian's python3-numpy, numpy/core/tests/) and numpy 2.4 (the
cp311 venv's wheel, numpy/_core/tests/). They must pass, and the only
findings allowed are the true OWNDATA misuses of
test_mem_policy.py::test_switch_owner, the same on both.

Why test_switch_owner is a real bug, not noise: its extension builds an
array on `malloc(20)` without a handler (PyArray_NewFromDescr with data),
then sets NPY_ARRAY_OWNDATA on it (`set_own`); when the array dies, numpy
frees data no handler allocated with plain free() -- the NEP 49 misuse the
test exists to exercise. numpy warns about it only when asked: numpy 1.24
when NUMPY_WARN_IF_NO_MEM_POLICY=1 at that moment, numpy 2 when the flag
read at import (or set by _set_numpy_warn_if_no_mem_policy, which the
"0"/"1" cases do) is on. capsan reports it as numpy-foreign-free, once per
parametrization (policy "0", "1", None): exactly three findings, each
freed inside test_switch_owner.

What else numpy 2's files do, and why it is no finding: test_set_policy
also installs a capsule named "not_mem_handler", which numpy 2 refuses
itself (ValueError), so nothing is installed; test_owner_is_base hands
malloc'd memory over through a PyCapsule base, the correct way.

test_new_policy reruns numpy's whole core suite through a shifting NEP 49
handler (several minutes natively; under numpy 2 it also leaks, for a
reason its docstring below gives): `make test` deselects it, `make
check-numpy` (CAPSAN_CHECK_NUMPY=1) runs it. numpy 2 marks it skip ("too
slow", gh-23975); check-numpy runs it anyway (the np_unskip plugin), with
hypothesis, which numpy 2's own conftest imports, installed once into a
cache next to the venvs when the venv lacks it.
"""
import json
import re
import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import (CAPSAN, LIBCAPSAN, SCENARIOS, STATIC_PY, base_env, capsan_report,
                      current_python, fixdir_for, no_core, summarize, trace_files)

sys.path.insert(0, str(SCENARIOS))
from np_testlib import PYDIR, numpy_version, require_np  # noqa: E402

SWITCH_OWNER = {"test_switch_owner[0]", "test_switch_owner[1]", "test_switch_owner[None]"}
SLOW = os.environ.get("CAPSAN_CHECK_NUMPY") == "1"
# Debian's numpy 1.24, and numpy 2.4 in the cp311 venv
NUMPYS = ["static", "cp311"]
DEPS = Path(os.environ.get("CAPSAN_VENVS") or Path.home() / ".cache" / "capsan" / "venvs").parent


def suite_python(tag):
    return STATIC_PY if tag == "static" else current_python(tag)


def numpy_tests(py) -> Path:
    """numpy's own tests directory as the installed numpy ships it:
    numpy/_core/tests in numpy 2, numpy/core/tests in 1.x."""
    cp = subprocess.run([str(py), "-c", "import numpy; print(numpy.__file__)"],
                        capture_output=True, text=True, timeout=60, env=base_env())
    assert cp.returncode == 0, cp.stderr
    root = Path(cp.stdout.strip()).parent
    for sub in ("_core", "core"):
        d = root / sub / "tests"
        if (d / "test_mem_policy.py").exists() and (d / "test_dlpack.py").exists():
            return d
    pytest.fail(f"no test_mem_policy.py / test_dlpack.py under {root} (the wheel ships them)",
                pytrace=False)


def hypothesis_path(py, tag):
    """A directory with hypothesis for `py` (numpy 2's own conftest imports
    it; test_new_policy runs numpy's suite through it), or None when the
    interpreter has it. Installed once with pip into a cache."""
    if subprocess.run([str(py), "-c", "import hypothesis"], capture_output=True,
                      env=base_env()).returncode == 0:
        return None
    d = DEPS / "np-test-deps" / tag
    if not (d / "hypothesis").is_dir():
        cp = subprocess.run([str(py), "-m", "pip", "install", "-q", "--disable-pip-version-check",
                             "--target", str(d), "hypothesis"], capture_output=True, text=True,
                            timeout=600)
        assert cp.returncode == 0, f"pip could not install hypothesis into {d}:\n{cp.stderr}"
    return d


def run_suite(tmp_path, extra_args, *, mode, tag, options=(), timeout=300, pythonpath=()):
    """pytest on numpy's two files with `tag`'s interpreter. mode: "plugin"
    (LD_PRELOAD + the plugin with --capsan), "late" (the plugin alone: it
    starts the runtime after pytest and numpy are loaded), "native" (no
    capsan) or "run" (`capsan run`, no plugin). Returns (CompletedProcess,
    report, tests dir)."""
    py = suite_python(tag)
    require_np(py)
    tests = numpy_tests(py)
    e = base_env(None, py)
    e["PYTHONPATH"] = ":".join(map(str, [PYDIR, fixdir_for(py), SCENARIOS, *pythonpath]))
    opts = [f"log_path={tmp_path / 't'}", "exitcode=0", "keep_trace=always", *options]
    args = ["-m", "pytest", "-p", "no:cacheprovider", "-q", "-rfE",
            str(tests / "test_mem_policy.py"), str(tests / "test_dlpack.py"), *extra_args]
    if mode in ("plugin", "late", "native"):
        if mode == "plugin":
            e["LD_PRELOAD"] = str(LIBCAPSAN)
        e["CAPSAN_OPTIONS"] = ":".join(opts)
        cmd = [str(py), *args]
    else:
        e["CAPSAN_OPTIONS"] = ":".join(opts[1:])
        e["PYTEST_DISABLE_PLUGIN_AUTOLOAD"] = "1"
        cmd = [str(CAPSAN), "run", "--log-path", str(tmp_path / "t"), "--", str(py), *args]
    cp = subprocess.run(cmd, capture_output=True, text=True, env=e, timeout=timeout,
                        cwd=str(tmp_path), stdin=subprocess.DEVNULL, preexec_fn=no_core)
    report = None
    traces = trace_files(tmp_path)
    if traces:
        report = capsan_report(traces)[1]
    cp.describe = (f"command: {' '.join(cmd)}\nrc={cp.returncode}\n--- stdout\n{cp.stdout[-6000:]}"
                   f"\n--- stderr\n{cp.stderr[-4000:]}\n--- trace findings\n{summarize(report)}")
    return cp, report, tests


def frames_in(finding, path):
    return [fr for ev in finding["events"] for fr in ev["stack"]
            if fr.get("python") and Path(fr.get("file") or "").name == path.name]


def check_switch_owner_findings(all_findings, mem_policy, describe):
    """Exactly one numpy-foreign-free per test_switch_owner parametrization,
    freed inside test_switch_owner; nothing else."""
    kinds = sorted({f["kind"] for f in all_findings})
    assert kinds == ["numpy-foreign-free"], f"unexpected kinds {kinds}\n{describe}"
    assert len(all_findings) == 3, f"{len(all_findings)} findings, expected 3\n{describe}"
    for f in all_findings:
        fr = frames_in(f, mem_policy)
        assert fr and fr[0]["function"] == "test_switch_owner", (
            f"a foreign free outside test_switch_owner: {fr}\n{describe}")


@pytest.mark.parametrize("tag", NUMPYS)
def test_numpy_suites_with_the_plugin(tmp_path, tag):
    """LD_PRELOAD + `-p capsan.pytest_plugin --capsan`: every numpy test runs
    in its own trace scope; the JSON report says which test each finding
    belongs to."""
    out = tmp_path / "capsan.json"
    cp, report, tests = run_suite(tmp_path, ["-p", "capsan.pytest_plugin", "--capsan",
                                             "--capsan-allow=numpy-foreign-free",
                                             f"--capsan-report={out}", "-k",
                                             "not test_new_policy"], mode="plugin", tag=tag)
    assert cp.returncode == 0, cp.describe
    assert "passed" in cp.stdout and " failed" not in cp.stdout, cp.describe
    rep = json.loads(out.read_text())
    assert len(rep["tests"]) >= 60, f"only {len(rep['tests'])} traced tests\n{cp.describe}"
    with_findings = {t["nodeid"].split("::")[-1]: t["findings"] for t in rep["tests"]
                     if t["findings"]}
    assert set(with_findings) == SWITCH_OWNER, f"{sorted(with_findings)}\n{cp.describe}"
    mem_policy = tests / "test_mem_policy.py"
    check_switch_owner_findings([f for fs in with_findings.values() for f in fs], mem_policy,
                                cp.describe)
    assert rep["outside_tests"] == [], rep["outside_tests"]
    # the runtime's own record of the whole process agrees
    assert report is not None, cp.describe
    check_switch_owner_findings([f for p in report["processes"] for f in p["findings"]],
                                mem_policy, cp.describe)


@pytest.mark.parametrize("tag", NUMPYS)
def test_numpy_suites_after_a_late_start(tmp_path, tag):
    """`pytest --capsan` as a user runs it: the plugin starts capsan after
    pytest, numpy and the test modules are loaded. The suites count what
    they count natively, and only test_switch_owner's true findings come."""
    out = tmp_path / "capsan.json"
    plugin = ["-p", "capsan.pytest_plugin", "--capsan", "--capsan-allow=numpy-foreign-free",
              f"--capsan-report={out}"]
    sel = ["-k", "not test_new_policy"]
    cp, report, tests = run_suite(tmp_path, [*plugin, *sel], mode="late", tag=tag)
    assert cp.returncode == 0, cp.describe
    (tmp_path / "native").mkdir()
    ncp, _, _ = run_suite(tmp_path / "native", ["-p", "no:capsan", *sel], mode="native", tag=tag)
    assert ncp.returncode == 0, ncp.describe
    summary = re.compile(r"^\d+ passed.*$", re.M)
    late_line = summary.findall(cp.stdout)[-1].split(" in ")[0]
    native_line = summary.findall(ncp.stdout)[-1].split(" in ")[0]
    assert late_line == native_line, f"late start: {late_line}; natively: {native_line}"
    rep = json.loads(out.read_text())
    assert len(rep["tests"]) >= 60, f"only {len(rep['tests'])} traced tests\n{cp.describe}"
    with_findings = {t["nodeid"].split("::")[-1]: t["findings"] for t in rep["tests"]
                     if t["findings"]}
    assert set(with_findings) <= SWITCH_OWNER, f"{sorted(with_findings)}\n{cp.describe}"
    assert rep["outside_tests"] == [], rep["outside_tests"]


@pytest.mark.parametrize("tag", NUMPYS)
def test_numpy_suites_under_capsan_run(tmp_path, tag):
    """`capsan run` alone (global tracking, no plugin, no tracing handler):
    the same three findings, and the suites pass."""
    cp, report, tests = run_suite(tmp_path, ["-k", "not test_new_policy"], mode="run", tag=tag)
    assert cp.returncode == 0, cp.describe
    assert " failed" not in cp.stdout, cp.describe
    assert report is not None, cp.describe
    p, = report["processes"]
    assert p["summary"]["events"] > 1000, p["summary"]
    check_switch_owner_findings(p["findings"], tests / "test_mem_policy.py", cp.describe)


def reads_text(finding, tests):
    """A no-GIL warning raised inside numpy's own np.fromfile(..., sep=...)
    or np.fromstring(..., sep=...) call in one of numpy's test files."""
    for ev in finding["events"]:
        for fr in ev["stack"]:
            path = Path(fr.get("file") or "")
            if fr.get("python") and path.parent == tests and path.exists():
                line = path.read_text().splitlines()[fr["line"] - 1]
                if "fromfile(" in line or "fromstring(" in line:
                    return True
    return False


@pytest.mark.skipif(not SLOW, reason="test_new_policy takes > 5 min: run by `make check-numpy`")
@pytest.mark.parametrize("tag", NUMPYS)
def test_new_policy_under_capsan_run(tmp_path, tag):
    """numpy's whole core suite through the shifting handler, under capsan run.

    Expected, and why:
    - numpy-foreign-free in test_switch_owner (the nested run includes it
      again), see the module docstring;
    - capsule-no-gil and numpy-handler-no-gil warnings from numpy's own
      text reader, np.fromfile(f, sep=",") (1.24: test_deprecations.py)
      or np.fromstring(s, sep=" ") (2.4: test_longdouble.py), whichever
      the suite reaches first: numpy grows the buffer with
      PyDataMem_UserRENEW inside NPY_BEGIN_ALLOW_THREADS, so it reads the
      handler capsule and calls the handler's realloc without the GIL
      (tests/test_gil.py shows the same outside the suite). One warning per
      call site: one for the capsule read, and one or two for the realloc's
      Track and Untrack (the Untrack of the first growth frees nothing: a
      text short enough to grow its buffer once warns at the Track only,
      as test_deprecations.py's does on 1.24).
    - numpy 2 only: numpy-leak at exit, about 117 blocks, every one made
      while test_new_policy ran (its own `a` and `b`, and the arrays the
      nested session's collection and setup made) or by the outer
      session's collection (test_dlpack.py's parametrize values: the
      pinned frames run down to the outer pytest's own). numpy 2's
      _ArrayFunctionDispatcher has no garbage-collector support, and
      test_overrides.py::test_dispatcher_error builds a reference cycle
      through one (frame, dispatched function, dispatcher closure,
      exception, traceback, frame): that frame and every frame below it,
      test_new_policy's and the nested pytest session's with all it holds,
      and the outer session's below them, are never freed. Deselecting
      that one test in the nested run leaves no leak;
      tests/scenarios/np_dispatch_leak.py is the same cycle alone
      (test_numpy2.py::test_dispatcher_cycle_is_a_leak). Stacks are taken
      128 Python frames deep here, so each leak shows where it was made.
    Nothing else: no other leaks (void scalars parked in numpy's
    small-block cache are still reachable, not leaked), no other warnings."""
    py = suite_python(tag)
    extra = ["-k", "test_new_policy"]
    deps = []
    if tag != "static":
        extra = ["-p", "np_unskip", *extra]
        deps = [d for d in [hypothesis_path(py, tag)] if d]
    cp, report, tests = run_suite(tmp_path, extra, mode="run", tag=tag, timeout=5400,
                                  pythonpath=deps, options=["python_depth=128"])
    assert cp.returncode == 0, cp.describe
    assert "1 passed" in cp.stdout, cp.describe
    fs = [f for p in (report or {"processes": []})["processes"] for f in p["findings"]]
    mem_policy = tests / "test_mem_policy.py"
    foreign = [f for f in fs if f["kind"] == "numpy-foreign-free"
               and frames_in(f, mem_policy)
               and frames_in(f, mem_policy)[0]["function"] == "test_switch_owner"]
    nogil = [f for f in fs if f["kind"] in ("capsule-no-gil", "numpy-handler-no-gil")
             and f["severity"] == "warning" and reads_text(f, tests)]
    def made_by_the_run(f):
        """Made while test_new_policy ran, or by the outer session's
        collection of numpy's test files (parametrize values)."""
        frames = [fr for fr in f["events"][0]["stack"] if fr.get("python")]
        return any(fr["function"] == "test_new_policy"
                   and Path(fr.get("file") or "").name == mem_policy.name
                   for fr in frames) or (
            any(Path(fr.get("file") or "").parent == tests for fr in frames)
            and any(fr["function"] == "pytest_collection" for fr in frames))
    pinned = [f for f in fs if f["kind"] == "numpy-leak" and made_by_the_run(f)]
    bad = [f for f in fs if f not in foreign and f not in nogil and f not in pinned]
    assert not bad, "unexpected findings\n" + cp.describe
    if numpy_version(py) >= (2, 0):
        assert pinned, "numpy 2's dispatcher cycle pinned nothing?\n" + cp.describe
    else:
        assert not pinned, cp.describe
    assert len(foreign) == 3, cp.describe
    got = sorted(f["kind"] for f in nogil)
    assert got in (["capsule-no-gil", "numpy-handler-no-gil"],
                   ["capsule-no-gil", "numpy-handler-no-gil", "numpy-handler-no-gil"]), cp.describe
