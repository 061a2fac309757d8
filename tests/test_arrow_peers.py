"""Real peers of the Arrow PyCapsule interface: pyarrow, polars, duckdb,
nanoarrow, arro3-core and pandas (pinned in .ci/arrowvenvs, built by `make
arrow-venvs`) exchanging schemas, arrays and streams in every direction,
and duckdb on 4 threads scanning a pyarrow reader, report nothing; a real
reconsume through polars is reported with both consumers' lines."""
import re

import pytest

from conftest import SCENARIOS, assert_finding_at, findings, kinds, marker_line, run_capsan



@pytest.mark.parametrize("mode", ["wrap", "no-touch"])
def test_six_libraries_every_direction_clean(tmp_path, apy, mode):
    script = SCENARIOS / "ar_peers.py"
    opts = ["arrow_wrap=0"] if mode == "no-touch" else []
    res = run_capsan(script, tmp_path, interpreter=apy, options=opts, timeout=300)
    assert res.returncode == 0 and "clean" in res.stderr, res.describe()
    assert findings(res.report) == [], res.describe()
    # the exchanges were seen: Arrow events were judged
    assert res.report["processes"][0]["summary"]["events"] > 500, res.report["processes"][0]["summary"]


def test_polars_silent_reconsume(tmp_path, apy):
    script = SCENARIOS / "ar_polars_reconsume.py"
    res = run_capsan(script, tmp_path, interpreter=apy)
    # polars itself says nothing: the second Series is silently empty
    assert "1000 0" in res.stderr, res.describe()
    f = assert_finding_at(res, "arrow-reconsume", script, "again", event="reconsume",
                          innermost=False)
    assert f["object"]["type"] == "ArrowArray", f["object"]
    assert_finding_at(res, "arrow-reconsume", script, "first", event="borrow", innermost=False)
    assert_finding_at(res, "arrow-reconsume", script, "export", event="export")
    assert kinds(res.report) == {"arrow-reconsume"}, res.describe()


# pyarrow's own test_cffi.py (its _export_to_c / _import_from_c round
# trips, structs handed over by address) runs in test_arrow_byaddr.py,
# under capsan run and pytest --capsan, its pass counts checked against a
# native run.


def test_pandas_own_arrow_interface_tests(tmp_path, apy):
    """pandas 3's wheel ships its tests of the Arrow PyCapsule interface
    (frame and series __arrow_c_stream__/__arrow_c_array__, pyarrow-backed
    intervals) and of the dataframe interchange protocol: they pass under
    `capsan run` with `pytest --capsan`, and capsan finds nothing in them
    (Arrow structs are exchanged: the run's line counts them)."""
    import subprocess
    from conftest import BUILD
    site = subprocess.run([str(apy), "-c", "import pandas, os; print(os.path.dirname(pandas.__file__))"],
                          capture_output=True, text=True, check=True).stdout.strip()
    suites = [f"{site}/tests/{p}" for p in ("series/test_arrow_interface.py",
                                           "frame/test_arrow_interface.py",
                                           "arrays/interval/test_interval_pyarrow.py",
                                           "interchange")]
    code = ("import sys, pytest; sys.exit(pytest.main(['-q', '-p', 'no:cacheprovider', "
            "'--capsan', *%r]))" % (suites,))
    res = run_capsan(code, tmp_path, interpreter=apy, timeout=600,
                     env={"PYTHONPATH": f"{BUILD / 'python'}"})
    assert res.returncode == 0, res.describe()
    assert " passed" in res.stdout and " failed" not in res.stdout, res.stdout[-2000:]
    assert "traced test(s), no findings" in res.stdout, res.stdout[-2000:]
    assert findings(res.report) == [], res.describe()
    m = re.search(r"(\d+) Arrow structs watched", res.stderr)
    assert m and int(m.group(1)) > 0, res.stderr[-2000:]


def test_describe_says_a_dlpack_object_is_an_arrow_producer_too(tmp_path, apy):
    """A pyarrow Array has __dlpack__ and __arrow_c_array__: describe()
    shows the DLPack capsule and names the Arrow view (arrow=True shows it;
    arrow=False asks for DLPack only and says nothing more)."""
    script = SCENARIOS / "ar_describe_both.py"
    res = run_capsan(script, tmp_path, interpreter=apy,
                     env={"PYTHONPATH": str(SCENARIOS.parent.parent / "build" / "python")})
    assert res.returncode == 0, res.describe()
    hint = ("also an Arrow producer (__arrow_c_array__): describe(x, arrow=True) shows its "
            "Arrow structs")
    dl, rest = res.stderr.split("Arrow capsule", 1)
    assert "DLPack capsule 'dltensor_versioned'" in dl and hint in dl, res.stderr
    assert "arrow_array" in rest and "length 3" in rest, res.stderr
    assert rest.count("DLPack capsule") == 1 and hint not in rest, res.stderr
    assert findings(res.report) == [], res.describe()


def test_arrow_capsules_alive_at_os_exit_are_live_not_leaked(tmp_path, apy):
    """A fork-started multiprocessing worker ends with os._exit() while a
    module-level registry holds Arrow capsules (never consumed) and a
    nanoarrow stream: they are live-at-exit warnings, not arrow-leak
    errors, so the worker's exit code stays 0 and the run is clean of
    errors (it was 23 when a capsule's struct, never wrapped, was judged
    leaked)."""
    script = SCENARIOS / "ar_exit_live.py"
    res = run_capsan(script, tmp_path, interpreter=apy)
    assert "child read 3" in res.stdout and "child exitcode 0" in res.stdout, res.describe()
    assert res.returncode == 0, res.describe()
    fs = findings(res.report)
    assert fs and {f["kind"] for f in fs} == {"live-at-exit"}, res.describe()
    assert all(f["severity"] == "warning" for f in fs), res.describe()
    assert "ArrowArray" in res.stderr and "DLManagedTensor" not in res.stderr, res.stderr[-3000:]
    assert_finding_at(res, "live-at-exit", script, "capsules", event="export", innermost=False)


def test_numpy_memory_pyarrow_wraps_is_held_at_exit(tmp_path, apy):
    """pa.Table.from_pandas, pa.array and pa.chunked_array around NumPy
    arrays, kept in globals to the end (the everyday pandas -> pyarrow ->
    parquet script): pyarrow drops their buffers at shutdown without
    releasing the arrays, and the blocks were numpy-leak errors (exit 23).
    They are held; the one reference the program really lost is still a
    numpy-leak at its line."""
    script = SCENARIOS / "ar_numpy_zero_copy.py"
    res = run_capsan(script, tmp_path, interpreter=apy)
    assert "rows 10000 [0, 1, 2]" in res.stdout, res.describe()
    assert kinds(res.report) == {"numpy-leak"}, res.describe()
    leaks = findings(res.report, "numpy-leak")
    assert len(leaks) == 1 and leaks[0]["bytes"] == 72, res.describe()
    assert_finding_at(res, "numpy-leak", script, "lost", innermost=False)


def test_pytest_holds_what_pyarrow_wraps(tmp_path, apy):
    """pytest --capsan: a test that keeps pa.array(ndarray), a Table made
    from a pandas frame or a chunked array in a module global passes (the
    arrays are held by pyarrow's buffers, which the walk asks pyarrow for);
    the test that loses a reference fails with numpy-leak at its line."""
    import shutil
    import subprocess
    case = tmp_path / "test_held.py"
    shutil.copy(SCENARIOS / "ar_pytest_held.py", case)
    env = dict(__import__("os").environ,
               PYTHONPATH=str(SCENARIOS.parent.parent / "build" / "python"))
    env.pop("LD_PRELOAD", None)
    cp = subprocess.run([apy, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:randomly",
                         "--capsan", str(case)], capture_output=True, text=True, env=env,
                        cwd=tmp_path, timeout=300)
    out = cp.stdout + cp.stderr
    line = marker_line(SCENARIOS / "ar_pytest_held.py", "lost")
    assert f"FAILED test_held.py::test_lost - capsan: numpy-leak at test_held.py:{line}" in out, \
        out[-3000:]
    assert "1 failed, 3 passed" in out, out[-3000:]


def test_uninitialized_pyarrow_objects_at_exit(tmp_path, apy):
    """pa.Array, Table, RecordBatch and ChunkedArray made with __new__ only,
    alive at exit: the exit walk does not call their (crashing) getters; the
    program ends 0 and clean."""
    res = run_capsan(SCENARIOS / "ar_uninit_objects.py", tmp_path, interpreter=apy)
    assert "end 5" in res.stdout and res.returncode == 0, res.describe()
    assert findings(res.report) == [], res.describe()


# ---- issue 37 path 5: a Rust producer's stream moved out and dropped ----
DROPPED = SCENARIOS / "ar_stream_dropped.py"


def test_polars_stream_dropped_by_its_holder(tmp_path, apy):
    """A C reader moves polars' stream (made in Rust) out of its capsule
    into a heap holder, reads one batch and frees the holder without
    calling release: one arrow-leak of the stream, at the reader's line,
    with the NumPy buffer polars shares zero-copy as its indirect part
    (no numpy-leak of its own). The freed holder's stale bytes are no
    holder: capsan saw the stream called through it, and its free."""
    res = run_capsan(DROPPED, tmp_path, interpreter=apy, args=["bug"])
    assert res.returncode != 0 and "done" in res.stdout, res.describe()
    f = assert_finding_at(res, "arrow-leak", DROPPED, "consume", event="move")
    assert f["severity"] == "error" and f["object"]["type"] == "ArrowArrayStream", f
    assert f["indirect_objects"] == 1 and f["indirect_bytes"] == 800000, f
    assert f["indirect"][0]["kind"] == "numpy-leak", f
    alloc = [fr for fr in f["indirect"][0]["events"][0]["stack"] if fr["python"]]
    assert alloc and alloc[0]["line"] == marker_line(DROPPED, "buffer"), alloc
    assert kinds(res.report) == {"arrow-leak"}, res.describe()
    assert len(findings(res.report)) == 1, res.describe()


def test_polars_stream_released_by_its_reader_is_clean(tmp_path, apy):
    res = run_capsan(DROPPED, tmp_path, interpreter=apy, args=["fixed"])
    assert res.returncode == 0 and "done" in res.stdout, res.describe()
    assert findings(res.report) == [], res.describe()


def test_a_librarys_own_placeholder_capsule_is_clean(tmp_path, apy):
    """nanoarrow reads back an empty schema capsule it made itself (issue 37
    path 9): no arrow-bad-struct. The same empty capsule from another
    library stays one (test_arrow_findings' handed-out-empty cases)."""
    res = run_capsan(SCENARIOS / "ar_own_placeholder.py", tmp_path, interpreter=apy, timeout=300)
    assert res.returncode == 0 and ("imported 3" in res.stdout or "refused" in res.stdout), \
        res.describe()
    assert findings(res.report) == [], res.describe()
    assert res.report["processes"][0]["summary"]["events"] > 0, res.describe()
