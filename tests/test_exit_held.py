"""The normal exit's leak verdict against what Python still reaches (issue 37,
paths 4 and 8).

- Objects a pytest session's items hold (parametrize values, a test class's
  instance) outlive finalization when a library keeps the session alive
  (numpy's test_numeric.py beside polars, nanoarrow's parametrized schema
  capsules): a module's globals reached them at atexit, so they are live at
  exit, not leaked (they were numpy-leak and arrow-leak errors). The
  reference a test really loses is still a leak at its line.
- A capsule a producer's error path loses (batchfeed.feed: its callback
  raised) is reached by nothing at atexit: dlpack-leak at its export. The
  same library keeping the refused capsule for a retry reports nothing.
"""
import re
import shutil
import sys

import pytest

from conftest import (SCENARIOS, assert_finding_at, findings, fixdir_for, kinds, run_capsan,
                      summarize)

sys.path.insert(0, str(SCENARIOS))
from np_testlib import PYDIR  # noqa: E402



def run_pytest_file(scenario, tmp_path, py, mode):
    """pytest on a copy of the scenario (out of tests/, whose conftest is
    not the suite's) under `capsan run` (mode "run") or with the plugin on
    a preloaded runtime (mode "plugin": `pytest --capsan`); returns
    (Result, the copy)."""
    case = tmp_path / f"test_{scenario.stem}.py"
    shutil.copy(scenario, case)
    args = ["-q", "-p", "no:cacheprovider", str(case)]
    env = None
    if mode == "plugin":
        args += ["-p", "capsan.pytest_plugin", "--capsan"]
        env = {"PYTHONPATH": f"{fixdir_for(py)}:{PYDIR}"}
    code = f"import sys, pytest\nsys.exit(pytest.main({args!r}))\n"
    res = run_capsan(code, tmp_path, interpreter=py, timeout=600, env=env,
                     mode="run" if mode == "run" else "preload", options=["exitcode=0"])
    return res, case


@pytest.mark.parametrize("mode", ["run", "plugin"])
@pytest.mark.parametrize("scenario, kind, n_passed, leaks", [
    ("np_pytest_items.py", "numpy-leak", 6, ["lost"]),
    ("ar_pytest_params.py", "arrow-leak", 5, ["lost"]),
])
def test_what_pytest_items_hold_is_not_leaked(tmp_path, apy, scenario, kind, n_passed, leaks,
                                              mode):
    res, case = run_pytest_file(SCENARIOS / scenario, tmp_path, apy, mode)
    # every test ran; only the plugin fails any, and only those that lost
    # something (a test's own verdict)
    ran = {k: int(n) for n, k in re.findall(r"(\d+) (passed|failed)", res.stdout)}
    assert sum(ran.values()) == n_passed, res.describe()
    assert ran.get("failed", 0) <= (len(leaks) if mode == "plugin" else 0), res.describe()
    # the lost references, and nothing the items held
    assert kinds(res.report) == {kind}, summarize(res.report)
    assert len(findings(res.report, kind)) == len(leaks), summarize(res.report)
    for tag in leaks:
        assert_finding_at(res, kind, case, tag, innermost=False)
    # the held objects were watched: the verdict had something to judge
    summary = res.report["processes"][0]["summary"]
    assert summary["events"] > 20, summary


def test_capsule_lost_on_an_error_path_leaks(tmp_path, anypy):
    script = SCENARIOS / "dl_error_path.py"
    res = run_capsan(script, tmp_path, interpreter=anypy, args=["leak"])
    assert "refused: queue full" in res.stdout and "deleted 2" in res.stdout, res.describe()
    assert kinds(res.report) == {"dlpack-leak"}, summarize(res.report)
    assert len(findings(res.report, "dlpack-leak")) == 1, summarize(res.report)
    f = assert_finding_at(res, "dlpack-leak", script, "refused", event="export", innermost=False)
    assert f["severity"] == "error", f


def test_capsule_kept_for_a_retry_is_clean(tmp_path, anypy):
    script = SCENARIOS / "dl_error_path.py"
    res = run_capsan(script, tmp_path, interpreter=anypy, args=["retry"])
    assert "refused: queue full" in res.stdout and "deleted 3" in res.stdout, res.describe()
    assert findings(res.report) == [], summarize(res.report)
    # the three exports and their consumption were judged
    assert res.report["processes"][0]["summary"]["events"] >= 9, res.report["processes"][0]
