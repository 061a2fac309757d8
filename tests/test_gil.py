"""Calls without the GIL (issue 5): capsule API calls from a thread that
released the GIL, and a deleter that uses Python when torch calls it
without the GIL. Both fixtures really do it (tests/fixtures/nogil.c)."""
import pytest

from conftest import (SCENARIOS, STATIC_PY, assert_finding_at, current_python, findings, kinds,
                      run_capsan, summarize)

S = SCENARIOS / "gil_calls.py"


def test_capsule_call_without_gil(tmp_path):
    res = run_capsan(S, tmp_path, args=["capsule"])
    assert res.returncode == 0, "a warning keeps the exit status\n" + res.describe()
    f = assert_finding_at(res, "capsule-no-gil", S, "nogil-capsule", event="call")
    assert f["severity"] == "warning"
    assert kinds(res.report) == {"capsule-no-gil"}, summarize(res.report)
    assert "WARNING: capsan: capsule-no-gil" in res.stderr


@pytest.mark.parametrize("mode, line, deleter", [
    # a capsule call from the deleter
    ("deleter", "torch-frees", "bad_deleter"),
    # the struct freed with PyObject_Free (a producer that keeps small
    # structs in Python's object allocator): the allocator call is the
    # Python use (issue 20, class 1)
    ("deleter-objfree", "torch-objfrees", "objfree_deleter"),
])
@pytest.mark.parametrize("stack", ["debian", "cp311"])
def test_deleter_uses_python_without_gil(tmp_path, mode, line, deleter, stack):
    """On Debian's torch 1.13 and the venv's torch 2.13: both run a foreign
    deleter without the GIL."""
    py = STATIC_PY if stack == "debian" else current_python("cp311")
    res = run_capsan(S, tmp_path, args=[mode], interpreter=py)
    assert res.returncode == 23, res.describe()
    got = findings(res.report, "dlpack-deleter-no-gil")
    assert len(got) == 1, summarize(res.report)
    # the thread's Python frames are read without the GIL too (torch runs
    # the deleter from `del t`); the native frame names the deleter
    assert_finding_at(res, "dlpack-deleter-no-gil", S, line, event="call", innermost=False)
    frames = [fr for e in got[0]["events"] for fr in e["stack"] if not fr.get("python")]
    assert any(deleter in (fr.get("function") or "") for fr in frames), got[0]
    assert kinds(res.report) == {"dlpack-deleter-no-gil"}, summarize(res.report)


@pytest.mark.parametrize("stack", ["debian", "cp311"])
def test_deleter_frees_with_pyobject_free_with_the_gil_is_clean(tmp_path, stack):
    """The same deleter taking the GIL first: nothing to report."""
    py = STATIC_PY if stack == "debian" else current_python("cp311")
    res = run_capsan(S, tmp_path, args=["deleter-objfree-gil"], interpreter=py)
    assert res.returncode == 0 and "done" in res.stdout, res.describe()
    assert kinds(res.report) == set(), summarize(res.report)


def check_numpy_handler_without_gil(tmp_path, py=STATIC_PY):
    """numpy's own fromfile(sep=) reads the handler capsule and calls the
    handler's realloc with the GIL released (1.24 and 2.x): warnings at the
    Python line that read the file. lexsort's scratch buffer, also made
    without the GIL, comes from the legacy PyDataMem_NEW (no handler):
    nothing for it. tests/test_numpy2.py runs this on the numpy 2 venvs."""
    script = SCENARIOS / "np_nogil_numpy.py"
    res = run_capsan(script, tmp_path, interpreter=py)
    assert res.returncode == 0 and "sorted 0 99" in res.stdout, res.describe()
    assert "read 5000" in res.stdout, res.describe()
    f = assert_finding_at(res, "numpy-handler-no-gil", script, "fromfile", event="call",
                          innermost=False)
    assert f["severity"] == "warning" and "call site" in f["message"]
    assert_finding_at(res, "capsule-no-gil", script, "fromfile", event="call", innermost=False)
    assert kinds(res.report) == {"numpy-handler-no-gil", "capsule-no-gil"}, summarize(res.report)
    lines = {fr["line"] for f in findings(res.report) for e in f["events"] for fr in e["stack"]
             if fr.get("python") and fr.get("file", "").endswith("np_nogil_numpy.py")}
    src = script.read_text().splitlines()
    assert all("fromfile" in src[n - 1] for n in lines), (lines, summarize(res.report))


def test_numpy_handler_without_gil(tmp_path):
    check_numpy_handler_without_gil(tmp_path)
