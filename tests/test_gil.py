"""Calls without the GIL (issue 5): capsule API calls from a thread that
released the GIL, and a deleter that uses Python when torch calls it
without the GIL. Both fixtures really do it (tests/fixtures/nogil.c)."""
from conftest import (SCENARIOS, assert_finding_at, findings, kinds, run_capsan, summarize)

S = SCENARIOS / "gil_calls.py"


def test_capsule_call_without_gil(tmp_path):
    res = run_capsan(S, tmp_path, args=["capsule"])
    assert res.returncode == 0, "a warning keeps the exit status\n" + res.describe()
    f = assert_finding_at(res, "capsule-no-gil", S, "nogil-capsule", event="call")
    assert f["severity"] == "warning"
    assert kinds(res.report) == {"capsule-no-gil"}, summarize(res.report)
    assert "WARNING: capsan: capsule-no-gil" in res.stderr


def test_deleter_uses_python_without_gil(tmp_path):
    res = run_capsan(S, tmp_path, args=["deleter"])
    assert res.returncode == 23, res.describe()
    got = findings(res.report, "dlpack-deleter-no-gil")
    assert len(got) == 1, summarize(res.report)
    # no Python frames without the GIL: the native frame names the deleter
    frames = [fr for e in got[0]["events"] for fr in e["stack"] if not fr.get("python")]
    assert any("bad_deleter" in (fr.get("function") or "") for fr in frames), got[0]
    assert kinds(res.report) == {"dlpack-deleter-no-gil"}, summarize(res.report)


def test_numpy_handler_without_gil(tmp_path):
    """numpy 1.24's own lexsort reaches the memory handler with the GIL
    released (NPY_BEGIN_THREADS): a warning at the Python line that sorted."""
    script = SCENARIOS / "np_nogil_numpy.py"
    res = run_capsan(script, tmp_path)
    assert res.returncode == 0 and "sorted 0 99" in res.stdout, res.describe()
    # np.lexsort is numpy's __array_function__ dispatcher: the line is further out
    f = assert_finding_at(res, "numpy-handler-no-gil", script, "lexsort", event="call",
                          innermost=False)
    assert f["severity"] == "warning" and "call site" in f["message"]
    assert kinds(res.report) == {"numpy-handler-no-gil"}, summarize(res.report)
