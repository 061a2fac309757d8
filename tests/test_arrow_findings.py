"""The Arrow PyCapsule interface (rulebook-seams R40-R48): every finding
kind committed for real by the arrowfx fixture (a dataframe library's
producer and consumer in C, one bug each), reported with the Python line
of the export and of each consumer, on Debian's 3.11 (both builds) and the
3.11 and 3.13 venvs."""
import signal

import pytest

from conftest import (DEFAULT_EXITCODE, INTERPRETERS, SCENARIOS, assert_finding_at,
                      assert_lsan_stderr, current_python, events_at, findings, is_signal, kinds,
                      marker_line, process_of, require_fixtures, run_capsan)

S = SCENARIOS / "ar_fixtures.py"


@pytest.fixture(params=["static", "shared", "cp311", "cp313"])
def py(request):
    if request.param in INTERPRETERS:
        require_fixtures()
        return INTERPRETERS[request.param]
    return current_python(request.param)


def run(tmp_path, py, case, options=()):
    return run_capsan(S, tmp_path, interpreter=py, args=[case], options=list(options))


def only(res, expected):
    assert kinds(res.report) == set(expected), res.describe()


def test_clean_exchanges(tmp_path, py):
    """Moves, borrows, a consumer's own release, a stream, a device array,
    and a capsule nobody consumed: nothing to report."""
    res = run(tmp_path, py, "clean")
    assert res.returncode == 0 and "done" in res.stdout, res.describe()
    assert findings(res.report) == [], res.describe()


def test_clean_without_touching_structs(tmp_path, py):
    res = run(tmp_path, py, "clean", ["arrow_wrap=0"])
    assert res.returncode == 0 and "done" in res.stdout, res.describe()
    assert findings(res.report) == [], res.describe()


def test_leak_moved_never_released(tmp_path, py):
    """tarantool #11338's shape: the consumer moves the array out and never
    releases it."""
    res = run(tmp_path, py, "leak")
    assert res.returncode == DEFAULT_EXITCODE, res.describe()
    f = assert_finding_at(res, "arrow-leak", S, "export-array", event="export")
    assert f["object"]["type"] == "ArrowArray", f["object"]
    assert_finding_at(res, "arrow-leak", S, "leak", event="borrow")
    assert_finding_at(res, "arrow-leak", S, "leak", event="move")
    only(res, ["arrow-leak"])
    assert_lsan_stderr(res.stderr, "arrow-leak")


def test_leak_capsule_without_destructor(tmp_path, py):
    res = run(tmp_path, py, "no-dtor")
    f = assert_finding_at(res, "arrow-leak", S, "export-array", event="export")
    assert "without a destructor" in f["message"], f["message"]
    assert_finding_at(res, "arrow-leak", S, "no-dtor", event="destroy")
    only(res, ["arrow-leak"])


def test_double_release_copy_not_move(tmp_path, py):
    """The consumer copies the struct without marking the source released
    and releases its copy; the capsule releases the source again. Reported
    before the second release runs; protect=1 skips it."""
    res = run(tmp_path, py, "double-release", ["protect=1"])
    assert res.returncode == DEFAULT_EXITCODE and "done" in res.stdout, res.describe()
    f = assert_finding_at(res, "arrow-double-release", S, "double-release", event="release")
    rel = [e for e in f["events"] if e["event"] == "release"]
    assert len(rel) == 2, f["events"]
    assert_finding_at(res, "arrow-double-release", S, "export-array", event="export")
    only(res, ["arrow-double-release"])


def test_double_release_without_protect_really_crashes(tmp_path):
    res = run(tmp_path, INTERPRETERS["static"], "double-release")
    assert is_signal(res.returncode, signal.SIGABRT) or is_signal(res.returncode, signal.SIGSEGV), \
        res.describe()
    assert "arrow-double-release" in res.stderr, "not reported before the crash\n" + res.describe()
    assert_finding_at(res, "arrow-double-release", S, "double-release", event="release")
    assert process_of(res.report)["ended"] == "signal"


def test_release_not_cleared(tmp_path, py):
    """nanoarrow #203's shape: the producer's release leaves release set; a
    consumer releases early and the capsule's destructor, seeing it still
    set, releases again."""
    res = run(tmp_path, py, "not-cleared", ["protect=1"])
    assert "done" in res.stdout, res.describe()
    assert_finding_at(res, "arrow-release-not-cleared", S, "not-cleared", event="release")
    assert_finding_at(res, "arrow-release-not-cleared", S, "export-array", event="export")
    f = assert_finding_at(res, "arrow-double-release", S, "not-cleared", event="release")
    assert any("skipped" in str(e) or e["event"] == "release" for e in f["events"])
    only(res, ["arrow-release-not-cleared", "arrow-double-release"])


def test_reconsume(tmp_path, py):
    """A stream capsule consumed twice (duckdb #13793's shape)."""
    res = run(tmp_path, py, "reconsume")
    assert "done" in res.stdout, res.describe()
    f = assert_finding_at(res, "arrow-reconsume", S, "reconsume", event="reconsume")
    assert f["object"]["type"] == "ArrowArrayStream"
    assert_finding_at(res, "arrow-reconsume", S, "first", event="borrow")
    assert_finding_at(res, "arrow-reconsume", S, "export-stream", event="export")
    only(res, ["arrow-reconsume"])


def test_use_after_release(tmp_path, py):
    """arrow-adbc #4363's shape: a shallow copy of a stream asked for its
    last error after the original was released."""
    res = run(tmp_path, py, "use-after-release", ["protect=1"])
    assert "done" in res.stdout, res.describe()
    f = assert_finding_at(res, "arrow-use-after-release", S, "use-after-release", event="get-last-error")
    assert "get_last_error" in f["message"] and "stale copy" in f["message"], f["message"]
    assert_finding_at(res, "arrow-use-after-release", S, "export-stream", event="export")
    only(res, ["arrow-use-after-release"])


def test_stream_misuse_two_threads(tmp_path, py):
    """duckdb #1835's shape: two threads in get_next of one stream at once,
    without the GIL."""
    res = run(tmp_path, py, "stream-misuse")
    assert "done" in res.stdout, res.describe()
    f = findings(res.report, "arrow-stream-misuse")
    assert len(f) == 1, res.describe()
    ev = [e for e in f[0]["events"] if e["event"] == "get-next"]
    assert ev and ev[-1]["thread"] != 1, f[0]["events"]
    assert_finding_at(res, "arrow-stream-misuse", S, "export-stream", event="export")
    only(res, ["arrow-stream-misuse"])


def test_renamed(tmp_path, py):
    """A consumer renames the capsule as DLPack consumers do: the producer's
    destructor no longer finds its struct, and it leaks."""
    res = run(tmp_path, py, "renamed")
    assert_finding_at(res, "arrow-renamed", S, "renamed", event="rename")
    assert_finding_at(res, "arrow-renamed", S, "export-array", event="export")
    assert_finding_at(res, "arrow-leak", S, "renamed", event="destroy")
    only(res, ["arrow-renamed", "arrow-leak"])


def test_bad_struct_handed_out_empty(tmp_path, py):
    res = run(tmp_path, py, "empty")
    f = assert_finding_at(res, "arrow-bad-struct", S, "empty", event="reconsume")
    assert "first consumer" in f["message"]
    only(res, ["arrow-bad-struct"])


def test_bad_struct_device_type(tmp_path, py):
    res = run(tmp_path, py, "bad-device")
    f = assert_finding_at(res, "arrow-bad-struct", S, "bad-device", event="check")
    assert f["object"]["type"] == "ArrowDeviceArray" and "device_type 0" in f["message"]
    only(res, ["arrow-bad-struct"])


def test_no_touch_mode_still_sees_capsules(tmp_path, py):
    """arrow_wrap=0 never writes a struct: a reconsume and a capsule that dies
    with release set and no destructor are still seen; moves are not."""
    res = run(tmp_path, py, "reconsume", ["arrow_wrap=0"])
    assert_finding_at(res, "arrow-reconsume", S, "reconsume", event="reconsume")
    res = run(tmp_path / "b", py, "no-dtor", ["arrow_wrap=0"])
    assert_finding_at(res, "arrow-leak", S, "export-array", event="export")
    res = run(tmp_path / "c", py, "leak", ["arrow_wrap=0"])
    assert findings(res.report) == [], res.describe()


def test_scope_leak_in_api_mode(tmp_path, interp):
    """`import capsan`: the leak is judged when its capsan.trace() scope ends."""
    import json
    import subprocess
    from conftest import BUILD, base_env
    env = base_env(None, interp)
    env["PYTHONPATH"] = f"{BUILD / 'python'}:{env['PYTHONPATH']}"
    cp = subprocess.run([str(interp), str(SCENARIOS / "ar_scope.py")], capture_output=True,
                        text=True, env=env, timeout=120)
    lines = [json.loads(x) for x in cp.stdout.splitlines() if x.startswith("[")]
    assert lines == [["arrow-leak"], []], (cp.returncode, cp.stdout, cp.stderr[-3000:])


def test_killed_process_holds_arrow_structs(tmp_path):
    """SIGKILL: no leak verdict, but what it held is listed as arrow-leak warnings."""
    from conftest import BUILD, FIXDIR
    script = SCENARIOS / "ar_scope.py"
    res = run_capsan(script, tmp_path, interpreter=INTERPRETERS["static"], args=["kill"],
                     env={"PYTHONPATH": f"{BUILD / 'python'}:{FIXDIR}"})
    assert is_signal(res.returncode, signal.SIGKILL), res.describe()
    fs = findings(res.report, "arrow-leak")
    assert fs and all(f["severity"] == "warning" for f in fs), res.describe()
    assert_finding_at(res, "arrow-leak", script, "export", event="export")


def test_pytest_plugin_fails_arrow_tests(tmp_path):
    """pytest --capsan: the test that leaks an Arrow array and the one that
    consumes a capsule twice fail, naming the kind; the clean one passes."""
    import shutil
    import subprocess
    from conftest import BUILD, FIXDIR
    case = tmp_path / "test_ar_cases.py"
    shutil.copy(SCENARIOS / "ar_pytest_cases.py", case)
    env = dict(__import__("os").environ, PYTHONPATH=f"{BUILD / 'python'}:{FIXDIR}")
    env.pop("LD_PRELOAD", None)
    cp = subprocess.run(["/usr/bin/python3", "-m", "pytest", "-q", "-p", "no:cacheprovider",
                         "--capsan", str(case)], capture_output=True, text=True, env=env,
                        cwd=tmp_path, timeout=300)
    out = cp.stdout + cp.stderr
    assert "FAILED test_ar_cases.py::test_leaky - capsan: arrow-leak" in out, out[-3000:]
    assert "FAILED test_ar_cases.py::test_reconsume - capsan: arrow-reconsume" in out, out[-3000:]
    assert "2 failed, 1 passed" in out, out[-3000:]


def test_bad_name_near_miss(tmp_path, py):
    """R40: a producer written against the interface's first draft exports
    under arrowschema / arrowarray (apache/arrow PR 37797 renamed them); the
    consumer asking for the exact names fails. One warning per name and call
    site (three exports, two names, one site), at the export's line; the
    exit status stays the program's."""
    res = run(tmp_path, py, "bad-name")
    assert res.returncode == 0 and "done" in res.stdout, res.describe()
    fs = findings(res.report, "arrow-bad-name")
    assert len(fs) == 2, res.describe()
    names = set()
    for f in fs:
        assert f["severity"] == "warning" and f["object"]["type"] == "PyCapsule", f
        names.add(f["message"].split("'")[1])
    assert names == {"arrowschema", "arrowarray"}, names
    assert any("a near miss of 'arrow_array'" in f["message"] for f in fs), fs
    assert_finding_at(res, "arrow-bad-name", S, "export-array", event="export")
    only(res, ["arrow-bad-name"])
    assert_lsan_stderr(res.stderr, "arrow-bad-name", "warning")


def test_bad_name_twin_is_clean(tmp_path, py):
    """The same exports under the exact names: nothing."""
    res = run(tmp_path, py, "bad-name-twin")
    assert res.returncode == 0 and "done" in res.stdout, res.describe()
    assert findings(res.report) == [], res.describe()


def test_bad_name_suppressed(tmp_path):
    """The kind is suppressible as any other (KIND:pattern)."""
    supp = tmp_path / "supp.txt"
    supp.write_text("arrow-bad-name:ar_fixtures.py\n")
    res = run(tmp_path, INTERPRETERS["static"], "bad-name", [f"suppressions={supp}"])
    assert findings(res.report, "arrow-bad-name") == [], res.describe()


def test_child_left_by_parent_release(tmp_path, py):
    """R44 (arrow_deep=1, the default): a record batch whose release starts
    its loop over the columns at 1 leaves column 0 unreleased: an arrow-leak
    of child 0, reported at the parent's release with the export's line."""
    res = run(tmp_path, py, "child-leak")
    assert res.returncode == DEFAULT_EXITCODE and "done" in res.stdout, res.describe()
    fs = findings(res.report, "arrow-leak")
    assert len(fs) == 1 and fs[0]["severity"] == "error", res.describe()
    assert fs[0]["message"].startswith("child 0 of ArrowArray"), fs[0]["message"]
    assert fs[0]["object"]["type"] == "ArrowArray", fs[0]["object"]
    assert_finding_at(res, "arrow-leak", S, "export-batch", event="export")
    assert_finding_at(res, "arrow-leak", S, "child-leak", event="release")
    only(res, ["arrow-leak"])
    assert_lsan_stderr(res.stderr, "arrow-leak")


def test_moved_child_never_released(tmp_path, py):
    """A consumer moves column 0 out of the batch (legal: it owns it from
    then on), releases the rest and never releases the column: the child has
    a lifecycle of its own from its parent's release, where the move is
    first seen, and leaks at exit. The twin below releases it: clean."""
    res = run(tmp_path, py, "moved-child-leak")
    assert res.returncode == DEFAULT_EXITCODE and "done" in res.stdout, res.describe()
    f = assert_finding_at(res, "arrow-leak", S, "moved-child-leak", event="move-child",
                          innermost=False)
    assert f["object"]["type"] == "ArrowArray", f["object"]
    assert "a child moved out of its parent" in f["message"], f["message"]
    only(res, ["arrow-leak"])


def test_moved_child_born_at_its_mover(tmp_path, py):
    """A loader stages a batch: it moves the batch out of its capsule and
    column 0 out of the batch, and releases the batch in a later call, in
    which it releases the column twice (its success path, then its cleanup
    path through the holder's stale copy). The column's own life starts
    where its mover moved it (the staging line, where the capsule dies),
    not at the batch's release: its double release shows the move there."""
    res = run(tmp_path, py, "staged-twice", ["protect=1"])
    assert res.returncode == DEFAULT_EXITCODE and "done" in res.stdout, res.describe()
    f = assert_finding_at(res, "arrow-double-release", S, "staged-move", event="move-child",
                          innermost=False)
    assert f["object"]["type"] == "ArrowArray", f["object"]
    assert_finding_at(res, "arrow-double-release", S, "staged-flush", event="release",
                      innermost=False)
    assert not events_at(f, S, marker_line(S, "staged-flush"), "move-child"), res.describe()
    moves = [e for e in f["events"] if e["event"] == "move-child"]
    assert len(moves) == 1 and "capsule died" in moves[0]["phrase"], moves
    only(res, ["arrow-double-release"])


def test_moved_child_staged_twin_is_clean(tmp_path, py):
    """The same loader, fixed: it releases the column it moved out once."""
    res = run(tmp_path, py, "staged-fixed")
    assert res.returncode == 0 and "done" in res.stdout, res.describe()
    assert findings(res.report) == [], res.describe()


def test_child_leak_twin_is_clean(tmp_path, py):
    """The correct batch: moved, a column moved out before the rest is
    released (legal: its mover releases it), borrowed, never consumed."""
    res = run(tmp_path, py, "child-leak-twin")
    assert res.returncode == 0 and "done" in res.stdout, res.describe()
    assert findings(res.report) == [], res.describe()


def test_child_leak_not_seen_without_deep(tmp_path):
    """arrow_deep=0 wraps no child: the same bug goes unseen (what the
    option costs is what it finds)."""
    res = run(tmp_path, INTERPRETERS["static"], "child-leak", ["arrow_deep=0"])
    assert res.returncode == 0 and "done" in res.stdout, res.describe()
    assert findings(res.report) == [], res.describe()
