"""DLPack tensors that leave the thread that exported them (tests/scenarios/
dl_threads.py). capsan judges an exchange on its own thread while it lasts
(preload/dlpack/young_dl.c) and moves a tensor to the shared lifecycle as soon as
anything else concerns it: another thread consumes or releases it, it
stays alive past younger exchanges, a finding needs its history, the
thread ends, the process forks or exits. What capsan says must be what the
lifecycle alone says (record_all=1 judges every event there)."""
import pytest

from conftest import (SCENARIOS, STATIC_PY, assert_clean_with_child, assert_finding_at,
                      current_python, findings, require_fixtures, run_capsan)

SCRIPT = SCENARIOS / "dl_threads.py"
MODES = pytest.mark.parametrize("options", ["", "record_all=1"],
                                ids=["young", "lifecycle-only"])


@pytest.fixture(params=["static", "cp311"])
def py(request):
    """Debian's numpy 1.24 and torch 1.13; the cp311 venv's numpy 2 and torch 2.13"""
    if request.param == "static":
        return STATIC_PY
    return current_python(request.param)


@MODES
def test_pipeline_is_clean(tmp_path, py, options):
    """4 threads exchanging numpy <-> torch, each dropping the others'
    tensors, 64 kept alive across the loop, a fork in the middle: no
    finding in either process, and every exchange was seen"""
    res = run_capsan(SCRIPT, tmp_path, args=["pipeline"], interpreter=py,
                     options=options or None, timeout=300)
    # 4 x 400 round trips: two exports, two consumes and two deletes each
    assert_clean_with_child(res, "survived pipeline", 4 * 400 * 6)


def run_fixture(tmp_path, mode, options):
    require_fixtures()
    res = run_capsan(SCRIPT, tmp_path, args=[mode], options=options or None)
    assert f"survived {mode}" in res.stdout, res.describe()
    assert res.report is not None, res.describe()
    return res


@MODES
def test_leak_on_a_thread_that_ended(tmp_path, options):
    """a worker consumes a tensor, never releases it and ends between
    clean exchanges: one dlpack-leak with the worker's lines"""
    res = run_fixture(tmp_path, "leak", options)
    kinds = [f["kind"] for f in findings(res.report)]
    assert kinds == ["dlpack-leak"], res.describe()
    assert_finding_at(res, "dlpack-leak", SCRIPT, "leak-export", event="export")
    assert_finding_at(res, "dlpack-leak", SCRIPT, "leak-consume", event="consume")


@MODES
def test_double_delete_among_clean_exchanges(tmp_path, options):
    """the second release finds the first, retired with its export and
    consume on the worker's own table: all four events in the finding"""
    res = run_fixture(tmp_path, "double", ":".join(o for o in (options, "protect=1") if o))
    kinds = [f["kind"] for f in findings(res.report)]
    assert kinds == ["dlpack-double-delete"], res.describe()
    f = assert_finding_at(res, "dlpack-double-delete", SCRIPT, "double", event="delete")
    evs = [e["event"] for e in f["events"]]
    assert evs[:2] == ["export", "consume"] and evs.count("delete") == 2, evs


@MODES
def test_loan_changed_released_on_another_thread(tmp_path, options):
    """consumed on the main thread, changed by its producer, released on a
    worker: the release on the worker compares it with its export"""
    res = run_fixture(tmp_path, "mutated", options)
    kinds = [f["kind"] for f in findings(res.report)]
    assert kinds == ["dlpack-bad-tensor"], res.describe()
    f = assert_finding_at(res, "dlpack-bad-tensor", SCRIPT, "mutated-export", event="export")
    threads = {e["event"]: e["thread"] for e in f["events"]}
    assert threads.get("delete") not in (None, threads["export"]), f["events"]
