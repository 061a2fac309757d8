"""dlpack-read-only-dropped: a consumer re-exports read-only memory it
consumed without DLPACK_FLAG_BITMASK_READ_ONLY (tests/scenarios/
dl_read_only.py, the imgstage fixture). numpy 2 is the producer: it marks
read-only arrays READ_ONLY in versioned capsules. Debian's numpy 1.24
cannot export versioned ones, so only the numpy 2 venvs run here."""
import pytest

from conftest import (DEFAULT_EXITCODE, SCENARIOS, assert_finding_at, assert_lsan_stderr,
                      current_python, findings, kinds, run_capsan, run_plain)

S = SCENARIOS / "dl_read_only.py"
NUMPY2 = ["cp311", "cp313"]


@pytest.fixture(params=NUMPY2)
def py(request):
    return current_python(request.param)


def dropped(res, tag, how):
    assert res.returncode == DEFAULT_EXITCODE, res.describe()
    assert kinds(res.report) == {"dlpack-read-only-dropped"}, res.describe()
    assert len(findings(res.report)) == 1, res.describe()
    # told at the hand-off, before the next stage could write
    f = assert_finding_at(res, "dlpack-read-only-dropped", S, tag, event="reexport")
    assert "READ_ONLY" in f["message"] and how in f["message"], f["message"]
    assert_finding_at(res, "dlpack-read-only-dropped", S, "export", event="export")
    assert_lsan_stderr(res.stderr, "dlpack-read-only-dropped")


def test_read_only_dropped_by_reexport(tmp_path, py):
    """The stage hands a read-only image on with flags 0: natively the next
    stage's numpy array is writable over bytes' memory."""
    native = run_plain(S, args=["bug"], interpreter=py)
    assert native.returncode == 0 and "writeable True" in native.stdout, (native.stdout,
                                                                         native.stderr)
    res = run_capsan(S, tmp_path, args=["bug"], interpreter=py)
    assert "writeable True" in res.stdout, res.describe()
    dropped(res, "handoff", "READ_ONLY cleared")


def test_read_only_dropped_by_legacy_reexport(tmp_path, py):
    """A legacy capsule has no flags: handing read-only memory on through
    one is the same bug, whatever the next consumer makes of it."""
    res = run_capsan(S, tmp_path, args=["legacy"], interpreter=py)
    dropped(res, "handoff-legacy", "legacy")


@pytest.mark.parametrize("how", ["good", "writable", "numpy"])
def test_read_only_kept_or_nothing_to_drop_is_clean(tmp_path, py, how):
    """The stage keeping the flag; a writable image handed on without it;
    numpy re-exporting a read-only array it imported (it keeps the flag)."""
    res = run_capsan(S, tmp_path, args=[how], interpreter=py)
    want = "writeable True" if how == "writable" else "writeable False"
    assert res.returncode == 0 and want in res.stdout, res.describe()
    assert findings(res.report) == [], res.describe()
