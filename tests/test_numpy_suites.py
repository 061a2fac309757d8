"""numpy's own NEP 49 and DLPack suites, from the installed python3-numpy
(numpy/core/tests/test_mem_policy.py and test_dlpack.py), run with capsan
active: they must pass, and the only findings allowed are the true
OWNDATA misuse of test_mem_policy.py::test_switch_owner.

Why test_switch_owner is a real bug, not noise: its extension builds an
array on `malloc(20)` without a handler (PyArray_NewFromDescr with data),
then sets NPY_ARRAY_OWNDATA on it (`set_own`); when the array dies, numpy
frees data no handler allocated with plain free() -- the NEP 49 misuse the
test exists to exercise (numpy warns about it only when
NUMPY_WARN_IF_NO_MEM_POLICY=1). capsan reports it as numpy-foreign-free,
once per parametrization (policy "0", "1", None): exactly three findings.

test_new_policy reruns numpy's whole core suite through a shifting NEP 49
handler (over five minutes natively): `make test` deselects it, `make
check-numpy` (CAPSAN_CHECK_NUMPY=1) runs it.
"""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import (CAPSAN, FIXDIR, LIBCAPSAN, STATIC_PY, base_env,
                      capsan_report, no_core, summarize, trace_files)

sys.path.insert(0, str(Path(__file__).resolve().parent / "scenarios"))
from np_testlib import PYDIR, require_np  # noqa: E402

import numpy  # noqa: E402  (the installed python3-numpy, as the subprocesses see it)

NPTESTS = Path(numpy.__file__).parent / "core" / "tests"
MEM_POLICY = NPTESTS / "test_mem_policy.py"
DLPACK = NPTESTS / "test_dlpack.py"
SWITCH_OWNER = {"test_switch_owner[0]", "test_switch_owner[1]", "test_switch_owner[None]"}
SLOW = os.environ.get("CAPSAN_CHECK_NUMPY") == "1"


def run_suite(tmp_path, extra_args, *, mode, options=(), timeout=300):
    """pytest on numpy's two files. mode: "plugin" (LD_PRELOAD + the plugin with
    --capsan) or "run" (`capsan run`, no plugin)."""
    require_np()
    assert MEM_POLICY.exists() and DLPACK.exists(), NPTESTS
    e = base_env()
    e["PYTHONPATH"] = f"{PYDIR}:{FIXDIR}"
    opts = [f"log_path={tmp_path / 't'}", "exitcode=0", *options]
    args = ["-m", "pytest", "-p", "no:cacheprovider", "-q", "-rfE",
            str(MEM_POLICY), str(DLPACK), *extra_args]
    if mode == "plugin":
        e["LD_PRELOAD"] = str(LIBCAPSAN)
        e["CAPSAN_OPTIONS"] = ":".join(opts)
        cmd = [str(STATIC_PY), *args]
    else:
        e["CAPSAN_OPTIONS"] = ":".join(opts[1:])
        e["PYTEST_DISABLE_PLUGIN_AUTOLOAD"] = "1"
        cmd = [str(CAPSAN), "run", "--log-path", str(tmp_path / "t"), "--", str(STATIC_PY), *args]
    cp = subprocess.run(cmd, capture_output=True, text=True, env=e, timeout=timeout,
                        cwd=str(tmp_path), stdin=subprocess.DEVNULL, preexec_fn=no_core)
    report = None
    traces = trace_files(tmp_path)
    if traces:
        report = capsan_report(traces)[1]
    cp.describe = (f"command: {' '.join(cmd)}\nrc={cp.returncode}\n--- stdout\n{cp.stdout[-6000:]}"
                   f"\n--- stderr\n{cp.stderr[-4000:]}\n--- trace findings\n{summarize(report)}")
    return cp, report


def frames_in(finding, path):
    return [fr for ev in finding["events"] for fr in ev["stack"]
            if fr.get("python") and Path(fr.get("file") or "").name == path.name]


def check_switch_owner_findings(all_findings, describe):
    """Exactly one numpy-foreign-free per test_switch_owner parametrization,
    freed inside test_switch_owner; nothing else."""
    kinds = sorted({f["kind"] for f in all_findings})
    assert kinds == ["numpy-foreign-free"], f"unexpected kinds {kinds}\n{describe}"
    assert len(all_findings) == 3, f"{len(all_findings)} findings, expected 3\n{describe}"
    for f in all_findings:
        fr = frames_in(f, MEM_POLICY)
        assert fr and fr[0]["function"] == "test_switch_owner", (
            f"a foreign free outside test_switch_owner: {fr}\n{describe}")


def test_numpy_suites_with_the_plugin(tmp_path):
    """LD_PRELOAD + `-p capsan.pytest_plugin --capsan`: every numpy test runs
    in its own trace scope; the JSON report says which test each finding
    belongs to."""
    out = tmp_path / "capsan.json"
    cp, report = run_suite(tmp_path, ["-p", "capsan.pytest_plugin", "--capsan",
                                      "--capsan-allow=numpy-foreign-free",
                                      f"--capsan-report={out}", "-k", "not test_new_policy"],
                           mode="plugin")
    assert cp.returncode == 0, cp.describe
    assert "passed" in cp.stdout and " failed" not in cp.stdout, cp.describe
    rep = json.loads(out.read_text())
    assert len(rep["tests"]) >= 60, f"only {len(rep['tests'])} traced tests\n{cp.describe}"
    with_findings = {t["nodeid"].split("::")[-1]: t["findings"] for t in rep["tests"]
                     if t["findings"]}
    assert set(with_findings) == SWITCH_OWNER, f"{sorted(with_findings)}\n{cp.describe}"
    check_switch_owner_findings([f for fs in with_findings.values() for f in fs], cp.describe)
    assert rep["outside_tests"] == [], rep["outside_tests"]
    # the runtime's own record of the whole process agrees
    assert report is not None, cp.describe
    check_switch_owner_findings([f for p in report["processes"] for f in p["findings"]],
                                cp.describe)


def test_numpy_suites_under_capsan_run(tmp_path):
    """`capsan run` alone (global tracking, no plugin, no tracing handler):
    the same three findings, and the suites pass."""
    cp, report = run_suite(tmp_path, ["-k", "not test_new_policy"], mode="run")
    assert cp.returncode == 0, cp.describe
    assert " failed" not in cp.stdout, cp.describe
    assert report is not None, cp.describe
    p, = report["processes"]
    assert p["summary"]["events"] > 1000, p["summary"]
    check_switch_owner_findings(p["findings"], cp.describe)


def reads_with_fromfile(finding):
    """A no-GIL warning raised inside numpy's own np.fromfile(sep=...) call in
    one of numpy's test files."""
    for ev in finding["events"]:
        for fr in ev["stack"]:
            path = Path(fr.get("file") or "")
            if fr.get("python") and path.parent == NPTESTS and path.exists():
                line = path.read_text().splitlines()[fr["line"] - 1]
                if "np.fromfile(" in line:
                    return True
    return False


@pytest.mark.skipif(not SLOW, reason="test_new_policy takes > 5 min: run by `make check-numpy`")
def test_new_policy_under_capsan_run(tmp_path):
    """numpy's whole core suite through the shifting handler, under capsan run.

    Expected, and why:
    - numpy-foreign-free in test_switch_owner (the nested run includes it
      again), see the module docstring;
    - capsule-no-gil and numpy-handler-no-gil warnings from
      test_deprecations.py's np.fromfile(f, sep=","): numpy 1.24 grows the
      buffer with PyDataMem_UserRENEW inside NPY_BEGIN_ALLOW_THREADS, so it
      reads the handler capsule and calls the handler's realloc without the
      GIL (tests/test_gil.py shows the same outside the suite).
    Nothing else: no leaks (void scalars parked in numpy's small-block cache
    are still reachable, not leaked), no other warnings."""
    cp, report = run_suite(tmp_path, ["-k", "test_new_policy"], mode="run", timeout=3600)
    assert cp.returncode == 0, cp.describe
    assert "1 passed" in cp.stdout, cp.describe
    fs = [f for p in (report or {"processes": []})["processes"] for f in p["findings"]]
    foreign = [f for f in fs if f["kind"] == "numpy-foreign-free"
               and frames_in(f, MEM_POLICY)
               and frames_in(f, MEM_POLICY)[0]["function"] == "test_switch_owner"]
    nogil = [f for f in fs if f["kind"] in ("capsule-no-gil", "numpy-handler-no-gil")
             and f["severity"] == "warning" and reads_with_fromfile(f)]
    bad = [f for f in fs if f not in foreign and f not in nogil]
    assert not bad, "unexpected findings\n" + cp.describe
    assert len(foreign) == 3, cp.describe
    assert sorted(f["kind"] for f in nogil) == ["capsule-no-gil", "numpy-handler-no-gil"], \
        cp.describe
