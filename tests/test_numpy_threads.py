"""NumPy blocks that leave the thread that made them (tests/scenarios/
np_threads.py). capsan judges a block on its own thread while it is young
(preload/numpy/young_np.c) and moves it to the shared lifecycle as soon as anything
else concerns it: another thread frees it, it stays alive long, it is
reallocated in place, the process forks or ends. These programs cross
every one of those lines; what capsan says must be what the lifecycle
alone says (record_all=1 judges every event there)."""
import signal
import sys

import pytest

from conftest import (DEFAULT_EXITCODE, SCENARIOS, STATIC_PY, assert_clean_with_child,
                      current_python, findings, is_signal, parent_process, require_fixtures,
                      run_capsan, summarize)

sys.path.insert(0, str(SCENARIOS))
from np_testlib import assert_at, np_env  # noqa: E402

SCRIPT = SCENARIOS / "np_threads.py"


@pytest.fixture(params=["static", "cp311"])
def py(request):
    """Debian's numpy 1.24 and the cp311 venv's numpy 2"""
    if request.param == "static":
        require_fixtures()
        return STATIC_PY
    return current_python(request.param)


@pytest.mark.parametrize("options", ["", "record_all=1"], ids=["young", "lifecycle-only"])
def test_pipeline_is_clean(tmp_path, py, options):
    """4,000 worker arrays freed on the main thread, 2,000 of the main
    thread's freed on workers, 200 long-lived ones grown in place, a fork:
    no finding in either process, and the events were seen"""
    res = run_capsan(SCRIPT, tmp_path, args=["pipeline"], interpreter=py, env=np_env(py),
                     options=options or None)
    # 4 x 500 worker arrays and 2,000 of the main thread's: allocs and frees
    assert_clean_with_child(res, "survived pipeline", 8000)


def test_forks_while_threads_allocate(tmp_path, py):
    """20 forks while three threads make and free arrays without pause: the
    young tables are emptied into the lifecycle and locked across each fork,
    no process hangs, and no process (the parent, 20 children) finds
    anything: the children's inherited blocks are the parent's"""
    res = run_capsan(SCRIPT, tmp_path, args=["forks"], interpreter=py, env=np_env(py))
    assert res.returncode == 0 and "survived forks" in res.stdout, res.describe()
    assert len(res.report["processes"]) == 21, summarize(res.report)
    assert findings(res.report) == [], res.describe()
    # the children leave by os._exit
    assert all(p["ended"] in ("exit", "_exit") and p["status"] == 0
               for p in res.report["processes"]), summarize(res.report)


def test_a_worker_array_kept_in_c_is_one_leak(tmp_path, py):
    """one array a worker made, kept forever by C code on the main thread,
    among thousands that crossed threads and died: one numpy-leak, made on
    the worker's line"""
    res = run_capsan(SCRIPT, tmp_path, args=["leak"], interpreter=py, env=np_env(py))
    assert res.returncode == DEFAULT_EXITCODE and "survived leak" in res.stdout, res.describe()
    fs = parent_process(res.report)["findings"]
    assert [f["kind"] for f in fs] == ["numpy-leak"], res.describe()
    assert findings(res.report) == fs, "the forked child inherited the kept array: not its leak"
    assert_at(fs, "numpy-leak", SCRIPT, "worker-made", event="alloc")


def test_double_free_across_threads(tmp_path, py):
    """freed on a worker (PyDataMem_FREE, OWNDATA kept), freed again by numpy
    on the main thread: capsan says so before the second free runs, naming
    both frees and the alloc. Whether glibc then aborts depends on where the
    worker's arena put the block (it does on Debian's numpy, not always on
    numpy 2's); when it does, capsan spoke first and its crash report is
    written (its handler allocates nothing: glibc holds the arena's lock)"""
    res = run_capsan(SCRIPT, tmp_path, args=["double"], interpreter=py, env=np_env(py))
    err = res.stderr
    assert "numpy-double-free" in err, res.describe()
    if is_signal(res.returncode, signal.SIGABRT):
        assert "survived" not in res.stdout
        assert err.index("numpy-double-free") < err.index("double free "), err
        assert "Aborted at pc" in err, err
    else:
        assert res.returncode == DEFAULT_EXITCODE and "survived double" in res.stdout, \
            res.describe()
    fs = findings(res.report)
    assert_at(fs, "numpy-double-free", SCRIPT, "free-again", event="free")
    assert_at(fs, "numpy-double-free", SCRIPT, "free-first", event="free")
    assert_at(fs, "numpy-double-free", SCRIPT, "alloc-double", event="alloc")
