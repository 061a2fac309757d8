"""Correct NumPy memory traffic must give ZERO findings: a correct aligned
handler installed by the user, 4 threads, asyncio tasks, views and subclass
chains, np.resize / ndarray.resize(0) / sort / fromiter / pickling (numpy
1.24's wrong free sizes and free(NULL) included), void scalars through
numpy's small-block cache, under capsan.trace() and
under `capsan run` for the whole run. Every clean run also shows that
capsan saw the traffic (events counted), so "no findings" never means
"saw nothing"."""
import sys

import pytest

from conftest import SCENARIOS, findings, process_of, run_capsan, run_plain

sys.path.insert(0, str(SCENARIOS))
from np_testlib import FIXDIR, PYDIR, run_api  # noqa: E402

S = SCENARIOS
SCRIPT = S / "np_clean.py"
SECTIONS = ["aligned", "threads", "asyncio", "views", "ops", "voids"]
PYENV = {"PYTHONPATH": f"{FIXDIR}:{PYDIR}"}


def sections_ok(out):
    for s in SECTIONS:
        assert f"section {s} ok" in out, f"section {s} did not finish:\n{out[-2000:]}"
    assert out.rstrip().endswith("done"), out[-2000:]


def test_plain_run_works():
    """The scenario itself is correct without capsan."""
    cp = run_plain(SCRIPT, args=["run"], env=PYENV)
    assert cp.returncode == 0, cp.stderr
    sections_ok(cp.stdout)


def test_clean_under_trace(tmp_path, interp):
    r = run_api(SCRIPT, tmp_path, args=["trace"], interpreter=interp)
    assert r.returncode == 0, r.describe()
    sections_ok(r.stdout)
    assert r.findings == [], "findings in correct NumPy code\n" + r.describe()
    assert "ERROR: capsan" not in r.stderr and "WARNING: capsan" not in r.stderr, r.stderr[-4000:]


@pytest.mark.parametrize("section", SECTIONS)
def test_clean_section_under_trace(tmp_path, section):
    """Each section alone (a finding in one section is then easy to place)."""
    r = run_api(SCRIPT, tmp_path, args=["trace", section])
    assert r.returncode == 0, r.describe()
    assert f"section {section} ok" in r.stdout, r.describe()
    assert r.findings == [], r.describe()


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


def test_clean_whole_run(tmp_path, interp):
    """Global tracking (capsan run): every alloc/free of every thread and
    context, whatever handler made it, no trace() anywhere."""
    res = run_capsan(SCRIPT, tmp_path, args=["run"], interpreter=interp, env=PYENV)
    # 4 threads x 500 arrays alone are 4000 allocations and 4000 frees
    assert_clean_run(res, min_events=8000)


def test_clean_whole_run_bare_preload(tmp_path):
    res = run_capsan(SCRIPT, tmp_path, args=["run"], mode="preload", env=PYENV)
    assert_clean_run(res, min_events=8000)


def test_trace_inside_capsan_run(tmp_path):
    """`import capsan` under capsan run binds the preloaded runtime: the trace
    scopes and the whole-run report both stay clean."""
    res = run_capsan(SCRIPT, tmp_path, args=["trace"], env=PYENV)
    assert_clean_run(res, min_events=8000)
    assert "CAPSAN-FINDINGS []" in res.stdout, res.describe()
