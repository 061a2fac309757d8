"""Correct NumPy memory traffic must give ZERO findings: a correct aligned
handler installed by the user, 4 threads, asyncio tasks, views and subclass
chains, np.resize / ndarray.resize(0) / sort / fromiter / pickling (numpy
1.24's wrong free sizes and free(NULL) included), void scalars through
numpy's small-block cache, under capsan.trace() and
under `capsan run` for the whole run. Every clean run also shows that
capsan saw the traffic (events counted), so "no findings" never means
"saw nothing". The check_* functions take the interpreter: tests/test_numpy2.py
runs them on the numpy 2 venvs."""
import sys

import pytest

from conftest import SCENARIOS, STATIC_PY, findings, process_of, run_capsan, run_plain

sys.path.insert(0, str(SCENARIOS))
from np_testlib import np_env, run_api  # noqa: E402

S = SCENARIOS
SCRIPT = S / "np_clean.py"
SECTIONS = ["aligned", "threads", "asyncio", "views", "ops", "voids"]


def sections_ok(out):
    for s in SECTIONS:
        assert f"section {s} ok" in out, f"section {s} did not finish:\n{out[-2000:]}"
    assert out.rstrip().endswith("done"), out[-2000:]


def check_plain_run_works(py=STATIC_PY):
    """The scenario itself is correct without capsan."""
    cp = run_plain(SCRIPT, args=["run"], env=np_env(py), interpreter=py)
    assert cp.returncode == 0, cp.stderr
    sections_ok(cp.stdout)


def test_plain_run_works():
    check_plain_run_works()


def check_clean_under_trace(tmp_path, py):
    r = run_api(SCRIPT, tmp_path, args=["trace"], interpreter=py)
    assert r.returncode == 0, r.describe()
    sections_ok(r.stdout)
    assert r.findings == [], "findings in correct NumPy code\n" + r.describe()
    assert "ERROR: capsan" not in r.stderr and "WARNING: capsan" not in r.stderr, r.stderr[-4000:]


def test_clean_under_trace(tmp_path, interp):
    check_clean_under_trace(tmp_path, interp)


def check_clean_section_under_trace(tmp_path, section, py=STATIC_PY):
    """Each section alone (a finding in one section is then easy to place)."""
    r = run_api(SCRIPT, tmp_path, args=["trace", section], interpreter=py)
    assert r.returncode == 0, r.describe()
    assert f"section {section} ok" in r.stdout, r.describe()
    assert r.findings == [], r.describe()


@pytest.mark.parametrize("section", SECTIONS)
def test_clean_section_under_trace(tmp_path, section):
    check_clean_section_under_trace(tmp_path, section)


def assert_clean_run(res, min_events):
    assert res.returncode == 0, res.describe()
    sections_ok(res.stdout)
    assert res.report is not None, "no trace written: capsan saw no event\n" + res.describe()
    assert findings(res.report) == [], "findings in correct NumPy code\n" + res.describe()
    p = process_of(res.report)
    assert p["ended"] == "exit" and p["status"] == 0, p
    assert p["summary"]["errors"] == 0 and p["summary"]["leaked_bytes"] == 0, p["summary"]
    assert p["summary"]["events"] >= min_events, (
        f"capsan saw {p['summary']['events']} events, expected >= {min_events}\n"
        + res.describe())


def check_clean_whole_run(tmp_path, py, mode="run", options=None):
    """Global tracking (capsan run): every alloc/free of every thread and
    context, whatever handler made it, no trace() anywhere."""
    res = run_capsan(SCRIPT, tmp_path, args=["run"], interpreter=py, env=np_env(py), mode=mode,
                     options=options)
    # 4 threads x 500 arrays alone are 4000 allocations and 4000 frees
    assert_clean_run(res, min_events=8000)


def test_clean_whole_run(tmp_path, interp):
    check_clean_whole_run(tmp_path, interp)


@pytest.mark.parametrize("stacks", ["python_depth=0", "python_depth=0:native_depth=0"])
def test_clean_whole_run_stacks_off(tmp_path, anypy, stacks):
    """Without Python frames, what numpy allocates while it is imported is
    still module data, not a leak (numpy 2 keeps such blocks where the exit
    scan cannot see them)."""
    check_clean_whole_run(tmp_path, anypy, options=stacks.split(":"))


def test_clean_whole_run_bare_preload(tmp_path):
    check_clean_whole_run(tmp_path, STATIC_PY, mode="preload")


def check_trace_inside_capsan_run(tmp_path, py=STATIC_PY):
    """`import capsan` under capsan run binds the preloaded runtime: the trace
    scopes and the whole-run report both stay clean."""
    res = run_capsan(SCRIPT, tmp_path, args=["trace"], env=np_env(py), interpreter=py)
    assert_clean_run(res, min_events=8000)
    assert "CAPSAN-FINDINGS []" in res.stdout, res.describe()


def test_trace_inside_capsan_run(tmp_path):
    check_trace_inside_capsan_run(tmp_path)
