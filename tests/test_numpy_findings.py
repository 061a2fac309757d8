"""Every numpy-* finding kind, committed for real by a fixture extension
(tests/fixtures/np_*.c) driven from a scenario (tests/scenarios/np_*.py),
seen two ways: through the importable package (`import capsan`,
`capsan.trace()`, no preload) and for a whole run (`capsan run`).

Each test asserts the kind and the scenario line (its `# <-- tag` marker)
of the event that matters; crashing bugs are also run without capsan to
show that the crash is the program's own, and that capsan reported the
finding before it.

Each test here is a check_*(tmp_path, py) run on Debian's python3 (numpy
1.24); tests/test_numpy2.py runs the same checks on the numpy 2 venvs.
"""
import re
import signal
import sys

import pytest

from conftest import (DEFAULT_EXITCODE, SCENARIOS, STATIC_PY, assert_lsan_stderr, capsan_report,
                      check_crash_report, crash_reports, events_at, findings, marker_line,
                      is_signal, kinds, process_of, run_capsan, run_plain, summarize)

sys.path.insert(0, str(SCENARIOS))
from np_testlib import assert_at, np_env, numpy_version, run_api, summarize_list  # noqa: E402

S = SCENARIOS

def only(fs, kind, n=None):
    got = {f["kind"] for f in fs or []}
    assert got == {kind}, f"expected only {kind}, got {sorted(got)}\n{summarize_list(fs)}"
    if n is not None:
        assert len(fs) == n, f"expected {n} {kind} finding(s)\n{summarize_list(fs)}"


def report_findings(res):
    return findings(res.report)


# ---------------------------------------------------------------- numpy-leak

def check_leak_keep_forever(tmp_path, py=STATIC_PY):
    """keep_forever() INCREFs the array and stores it in C: the 8000-byte block
    allocated inside the trace is never freed."""
    script = S / "np_leak.py"
    r = run_api(script, tmp_path, args=["keep"], interpreter=py)
    assert r.returncode == 0, r.describe()
    assert r.findings is not None, r.describe()
    only(r.findings, "numpy-leak", 1)
    f = assert_at(r.findings, "numpy-leak", script, "alloc-keep", event="alloc")
    assert f["bytes"] == 8000 and f["severity"] == "error", f
    # the readable repr names the user's line, not numpy's ones()
    line = __import__("conftest").marker_line(script, "alloc-keep")
    assert r.reprs == [f"Finding(kind='numpy-leak', bytes=8000, at='np_leak.py:{line}')"], r.reprs
    # API mode prints nothing live: the finding is the scope's
    assert "ERROR: capsan: numpy-leak" not in r.stderr, r.describe()
    assert "kept 1" in r.stdout


def test_leak_keep_forever(tmp_path):
    check_leak_keep_forever(tmp_path)


def check_leak_refcount(tmp_path, py=STATIC_PY):
    """new_leaked() returns an array created in C with one reference too many."""
    script = S / "np_leak.py"
    r = run_api(script, tmp_path, args=["refcount"], interpreter=py)
    assert r.returncode == 0, r.describe()
    only(r.findings, "numpy-leak", 1)
    f = assert_at(r.findings, "numpy-leak", script, "alloc-refcount", event="alloc")
    assert f["bytes"] == 4000
    native = [fr for fr in f["events"][0]["stack"] if not fr["python"]]
    assert any("np_leaky" in (fr.get("module") or "") for fr in native), (
        "the extension's own native frame is not in the allocation stack: "
        + str([fr.get("module") for fr in native]))


def test_leak_refcount(tmp_path):
    check_leak_refcount(tmp_path)


def check_leak_fixed_is_clean(tmp_path, py=STATIC_PY):
    r = run_api(S / "np_leak.py", tmp_path, args=["released"], interpreter=py)
    assert r.returncode == 0, r.describe()
    assert r.findings == [], r.describe()


def test_leak_fixed_is_clean(tmp_path):
    check_leak_fixed_is_clean(tmp_path)


def check_leak_at_exit(tmp_path, py=STATIC_PY):
    """The whole run (capsan run): a block never freed is reported at exit,
    with the allocation line, and the exit status becomes 23."""
    script = S / "np_leak.py"
    res = run_capsan(script, tmp_path, args=["exit"], env=np_env(py), interpreter=py)
    assert res.returncode == DEFAULT_EXITCODE, res.describe()
    assert "kept 1" in res.stdout
    fs = [f for f in report_findings(res) if f["kind"] == "numpy-leak"]
    f = assert_at(fs, "numpy-leak", script, "alloc-exit", event="alloc")
    assert f["bytes"] == 2400, f
    assert kinds(res.report) == {"numpy-leak"}, res.describe()
    assert_lsan_stderr(res.stderr, "numpy-leak")


def test_leak_at_exit(tmp_path):
    check_leak_at_exit(tmp_path)


# ---------------------------------------------------------------- numpy-foreign-free

def check_foreign_free_offset16_really_crashes(tmp_path, py=STATIC_PY):
    """OWNDATA on malloc()+16: numpy's free() is an invalid free and glibc
    aborts. Under capsan the finding is on stderr (and in the trace) before
    the abort, with the line that let the array die."""
    script = S / "np_owndata.py"
    native = run_plain(script, args=["offset16"], env=np_env(py), interpreter=py)
    assert is_signal(native.returncode, signal.SIGABRT), (native.returncode, native.stderr)
    assert "free(): invalid pointer" in native.stderr, native.stderr
    res = run_capsan(script, tmp_path, args=["offset16"], env=np_env(py), interpreter=py)
    assert is_signal(res.returncode, signal.SIGABRT), res.describe()
    assert "survived" not in res.stdout
    err = res.stderr
    assert "numpy-foreign-free" in err and "free(): invalid pointer" in err, res.describe()
    assert err.index("numpy-foreign-free") < err.index("free(): invalid pointer"), (
        "the finding must be printed before glibc aborts\n" + err)
    assert_at(report_findings(res), "numpy-foreign-free", script, "free-offset16", event="free")
    p = process_of(res.report)
    assert p["ended"] == "signal" and p["status"] == signal.SIGABRT, p


def test_foreign_free_offset16_really_crashes(tmp_path):
    check_foreign_free_offset16_really_crashes(tmp_path)


def check_foreign_free_exact_trace(tmp_path, py=STATIC_PY):
    """OWNDATA on a whole malloc'd block: free() succeeds, the program goes on,
    and only capsan says that numpy freed memory no handler allocated."""
    script = S / "np_owndata.py"
    native = run_plain(script, args=["exact"], env=np_env(py), interpreter=py)
    assert native.returncode == 0 and "survived exact" in native.stdout, native.stderr
    r = run_api(script, tmp_path, args=["exact", "trace"], interpreter=py)
    assert r.returncode == 0 and "survived exact" in r.stdout, r.describe()
    only(r.findings, "numpy-foreign-free", 1)
    f = assert_at(r.findings, "numpy-foreign-free", script, "free-exact", event="free")
    assert "PyCapsule" in f["message"], f"the message should name the fix: {f['message']}"


def test_foreign_free_exact_trace(tmp_path):
    check_foreign_free_exact_trace(tmp_path)


def check_foreign_free_exact_whole_run(tmp_path, py=STATIC_PY):
    script = S / "np_owndata.py"
    res = run_capsan(script, tmp_path, args=["exact"], env=np_env(py), interpreter=py)
    assert res.returncode == DEFAULT_EXITCODE and "survived exact" in res.stdout, res.describe()
    assert kinds(res.report) == {"numpy-foreign-free"}, res.describe()
    assert_at(report_findings(res), "numpy-foreign-free", script, "free-exact", event="free")
    assert_lsan_stderr(res.stderr, "numpy-foreign-free")


def test_foreign_free_exact_whole_run(tmp_path):
    check_foreign_free_exact_whole_run(tmp_path)


def check_foreign_memory_through_a_capsule_base_is_clean(tmp_path, py=STATIC_PY):
    """The fix the finding names: a PyCapsule base frees the block."""
    r = run_api(S / "np_owndata.py", tmp_path, args=["capsule", "trace"], interpreter=py)
    assert r.returncode == 0 and "survived capsule" in r.stdout, r.describe()
    assert r.findings == [], r.describe()
    res = run_capsan(S / "np_owndata.py", tmp_path / "run", args=["capsule"], env=np_env(py),
                     interpreter=py)
    assert res.returncode == 0 and res.report is not None, res.describe()
    assert findings(res.report) == [], res.describe()
    # the block was seen made and freed (capsan was watching)
    assert process_of(res.report)["summary"]["events"] >= 2, res.describe()


def test_foreign_memory_through_a_capsule_base_is_clean(tmp_path):
    check_foreign_memory_through_a_capsule_base_is_clean(tmp_path)


# ---------------------------------------------------------------- numpy-double-free

def check_double_free_really_crashes(tmp_path, py=STATIC_PY):
    """PyDataMem_FREE() on an array's data, OWNDATA left set: numpy frees the
    1024-byte block again and glibc aborts; capsan names both frees first."""
    script = S / "np_owndata.py"
    native = run_plain(script, args=["double"], env=np_env(py), interpreter=py)
    assert is_signal(native.returncode, signal.SIGABRT), (native.returncode, native.stderr)
    assert "double free" in native.stderr, native.stderr
    res = run_capsan(script, tmp_path, args=["double"], env=np_env(py), interpreter=py)
    assert is_signal(res.returncode, signal.SIGABRT), res.describe()
    err = res.stderr
    assert "numpy-double-free" in err and err.index("numpy-double-free") < err.index("double free "), err
    fs = report_findings(res)
    assert_at(fs, "numpy-double-free", script, "free-again", event="free")
    assert_at(fs, "numpy-double-free", script, "free-first", event="free")
    assert_at(fs, "numpy-double-free", script, "alloc-double", event="alloc")


def test_double_free_really_crashes(tmp_path):
    check_double_free_really_crashes(tmp_path)


def check_double_free_trace(tmp_path, py=STATIC_PY):
    """The same inside capsan.trace() (no preload): reported before the abort,
    even in API mode (the process will not live to report it)."""
    script = S / "np_owndata.py"
    r = run_api(script, tmp_path, args=["double", "trace"], interpreter=py)
    assert is_signal(r.returncode, signal.SIGABRT), r.describe()
    assert "ERROR: capsan: numpy-double-free" in r.stderr, r.describe()
    assert r.stderr.index("numpy-double-free") < r.stderr.index("double free "), r.stderr
    # the report on stderr names the line of the second free
    line = f"{script.name}:{marker_line(script, 'free-again')}"
    assert line in r.stderr[:r.stderr.index("double free ")], r.stderr


def test_double_free_trace(tmp_path):
    check_double_free_trace(tmp_path)


# ---------------------------------------------------------------- numpy-stale-handler

def check_stale_handler_swapped_in_place(tmp_path, py=STATIC_PY):
    """The handler struct is overwritten (its free function replaced) while an
    array allocated through it is alive: the free is through a changed handler."""
    script = S / "np_stale.py"
    res = run_capsan(script, tmp_path, args=["swap"], env=np_env(py), interpreter=py)
    assert res.returncode == DEFAULT_EXITCODE and "survived swap" in res.stdout, res.describe()
    fs = report_findings(res)
    assert kinds(res.report) == {"numpy-stale-handler"}, res.describe()
    assert_at(fs, "numpy-stale-handler", script, "free", event="free")
    assert_at(fs, "numpy-stale-handler", script, "alloc", event="alloc")
    assert_lsan_stderr(res.stderr, "numpy-stale-handler")
    r = run_api(script, tmp_path / "api", args=["swap", "trace"], interpreter=py)
    assert r.returncode == 0 and "survived swap" in r.stdout, r.describe()
    only(r.findings, "numpy-stale-handler", 1)
    assert_at(r.findings, "numpy-stale-handler", script, "free", event="free")


def test_stale_handler_swapped_in_place(tmp_path):
    check_stale_handler_swapped_in_place(tmp_path)


def check_pool_switch_in_place(tmp_path, py=STATIC_PY):
    """A pooled allocator's "switch pools" API re-points its immortal
    handler's ctx in place, and makes it current again, while an array it
    allocated is alive: numpy frees that array through the other pool. The
    pools' books show it natively; capsan says it at the free, naming the
    alloc (each block remembers the ctx and functions it was made with)."""
    script = S / "np_pool_switch.py"
    native = run_plain(script, args=["live"], env=np_env(py), interpreter=py)
    assert native.returncode == 0, native.stderr
    assert "('pageable', (1, 8000)), ('pinned', (-1, -8000))" in native.stdout, native.stdout
    for what in ("live", "back", "funcs"):
        res = run_capsan(script, tmp_path / what, args=[what], env=np_env(py), interpreter=py)
        assert res.returncode == DEFAULT_EXITCODE and "stats" in res.stdout, res.describe()
        fs = report_findings(res)
        assert kinds(res.report) == {"numpy-stale-handler"}, (what, res.describe())
        f = assert_at(fs, "numpy-stale-handler", script, "free-" + what, event="free")
        assert_at(fs, "numpy-stale-handler", script, "alloc-" + what, event="alloc")
        assert "re-pointed in place" in f["message"], f["message"]
        assert len(fs) == 1, summarize_list(fs)
        assert_lsan_stderr(res.stderr, "numpy-stale-handler")


def test_pool_switch_in_place(tmp_path):
    check_pool_switch_in_place(tmp_path)


def check_pool_switch_clean(tmp_path, py=STATIC_PY):
    """The twins: the same switches with no array alive across them, and
    functions "re-pointed" to the very same pointers: nothing to report."""
    script = S / "np_pool_switch.py"
    for what in ("idle", "same"):
        res = run_capsan(script, tmp_path / what, args=[what], env=np_env(py), interpreter=py)
        assert res.returncode == 0 and "stats" in res.stdout, res.describe()
        assert findings(res.report) == [], (what, res.describe())


def test_pool_switch_clean(tmp_path):
    check_pool_switch_clean(tmp_path)


def assert_told_at_death(fs, script, tags, why=""):
    """One numpy-stale-handler for each block made at the lines `tags`,
    told as its handler died (the destroy line), before any free: at its
    alloc line, with a handler-died event at the destroy line."""
    fs = [f for f in fs if f["kind"] == "numpy-stale-handler"]
    assert len(fs) == len(tags), summarize_list(fs)
    for tag in tags:
        f = assert_at(fs, "numpy-stale-handler", script, tag, event="alloc")
        assert events_at(f, script, marker_line(script, "destroy"), "handler-died"), f
        assert "outlive memory handler" in f["message"] and why in f["message"], f["message"]
    return fs


def check_stale_handler_struct_freed(tmp_path, py=STATIC_PY):
    """The PyDataMem_Handler struct is free()d while an array still uses it.
    Whether the program then survives depends on whether malloc reused the
    168 bytes before numpy reads the free function from them (a real
    use-after-free); the finding is told as the struct is freed, before
    any free through it. Without capsan, numpy 1.24 survives it; numpy 2.4
    on CPython 3.11 dies of it (SIGSEGV): either is the program's own doing."""
    script = S / "np_stale.py"
    native = run_plain(script, args=["struct"], env=np_env(py), interpreter=py)
    assert ((native.returncode == 0 and "survived struct" in native.stdout)
            or is_signal(native.returncode, signal.SIGSEGV)), (native.returncode, native.stderr)
    res = run_capsan(script, tmp_path, args=["struct"], env=np_env(py), interpreter=py)
    assert_told_at_death(report_findings(res), script, ["alloc"], "struct changed or was freed")
    assert kinds(res.report) == {"numpy-stale-handler"}, res.describe()
    if "survived struct" in res.stdout:
        assert res.returncode == DEFAULT_EXITCODE, res.describe()
    else:  # crashed in the use-after-free, after the report
        assert res.returncode < 0 or res.returncode > 128, res.describe()
        assert "numpy-stale-handler" in res.stderr, res.describe()


def test_stale_handler_struct_freed(tmp_path):
    check_stale_handler_struct_freed(tmp_path)


def check_stale_handler_ctx_freed(tmp_path, py=STATIC_PY):
    """The handler struct is intact, but free() was called on its ctx while
    arrays it made were alive: each is stale from that free() on (capsan
    watches free() of every known handler's ctx)."""
    script = S / "np_stale.py"
    res = run_capsan(script, tmp_path, args=["ctx"], env=np_env(py), interpreter=py)
    assert "survived ctx" in res.stdout, res.describe()
    assert_told_at_death(report_findings(res), script, ["alloc"], "ctx was freed")
    assert kinds(res.report) == {"numpy-stale-handler"}, res.describe()
    assert res.returncode == DEFAULT_EXITCODE, res.describe()


def test_stale_handler_ctx_freed(tmp_path):
    check_stale_handler_ctx_freed(tmp_path)


def check_stale_handler_two_arrays(tmp_path, py=STATIC_PY):
    """Two arrays outlive their handler's struct, which is freed: each block
    is stale from then on, and is told then, at its alloc line, whether a
    later free through the dead handler crashes (on the reused struct) or
    not: the verdict does not depend on what the crash interrupts."""
    script = S / "np_stale.py"
    res = run_capsan(script, tmp_path, args=["two"], env=np_env(py), interpreter=py)
    # a crash leaves the array not yet freed live at the end (a warning)
    assert kinds(res.report) - {"live-at-exit"} == {"numpy-stale-handler"}, res.describe()
    assert_told_at_death(report_findings(res), script, ["alloc", "alloc2"])
    if "survived two" in res.stdout:
        assert res.returncode == DEFAULT_EXITCODE, res.describe()
    else:
        [rep] = crash_reports(res.stderr)
        assert "2 finding(s) reported before the crash" in rep, rep


def test_stale_handler_two_arrays(tmp_path):
    check_stale_handler_two_arrays(tmp_path)


def check_stale_handler_crash_at_first_free(tmp_path, py=STATIC_PY):
    """Issue 44: the program dies (SIGSEGV) at its first free through the
    dead handler. Every block the handler still owned is in the crashed
    run's trace all the same, each at its alloc line: they were told when
    the handler died, not left to frees the crash never reaches."""
    script = S / "np_stale.py"
    res = run_capsan(script, tmp_path, args=["crash"], env=np_env(py), interpreter=py)
    assert res.returncode < 0 or res.returncode > 128, res.describe()
    assert "survived" not in res.stdout, res.describe()
    rep, trace = check_crash_report(res.stderr, "SEGV",
                                    f"np_stale.py:{marker_line(script, 'free')} in run")
    assert "2 finding(s) reported before the crash" in rep, rep
    # the trace of the crashed run, rendered on its own
    _, from_trace = capsan_report([trace])
    assert kinds(from_trace) - {"live-at-exit"} == {"numpy-stale-handler"}, summarize(from_trace)
    assert_told_at_death(findings(from_trace), script, ["alloc", "alloc2"])


def test_stale_handler_crash_at_first_free(tmp_path):
    check_stale_handler_crash_at_first_free(tmp_path)


def check_exit_leaks_grouped_live(tmp_path, py=STATIC_PY):
    """At exit the live stderr report groups leaks by where they were made,
    as LeakSanitizer does: one block for 20 arrays from one line, one for
    the array from another, largest first; the summary still counts 21."""
    src = (
        "import numpy as np\n"
        "import np_leaky as L\n"
        "for i in range(20):\n"
        "    L.keep_forever(np.ones(100))  # 800 bytes each\n"
        "L.keep_forever(np.ones(3))\n"
    )
    res = run_capsan(src, tmp_path, env=np_env(py), interpreter=py, options=["fast_unwind=0"])
    assert res.returncode == DEFAULT_EXITCODE, res.describe()
    heads = [ln for ln in res.stderr.splitlines() if "ERROR: capsan: numpy-leak" in ln]
    # the first calls of a line can take another C path before CPython
    # specializes the call: each path is its own group, so 20 arrays are at
    # most a few groups, not 20 blocks
    assert 2 <= len(heads) <= 4, res.stderr[-3000:]
    assert "Direct leak of 24 byte(s) in 1 object(s)" in res.stderr, res.stderr[-3000:]
    counts = [int(ln.split(" in ")[1].split()[0]) for ln in heads]
    assert sum(counts) == 21, heads
    sizes = [int(ln.split("Direct leak of ")[1].split()[0]) for ln in heads]
    assert sizes == sorted(sizes, reverse=True), heads
    assert "21 error(s)" in res.stderr and "leaked in 21 object(s)" in res.stderr, res.stderr[-800:]


def test_exit_leaks_grouped_live(tmp_path):
    check_exit_leaks_grouped_live(tmp_path)


# ---------------------------------------------------------------- numpy-bad-handler

BAD = {
    # mode: (marker tag, words the message must contain, what the program shows)
    "v2": ("install-v2", "version", "survived v2"),
    "misnamed": ("install-misnamed", "mem_handler", "MemoryError"),
    "null_free": ("install-null-free", "NULL", "survived null_free"),
    "unterminated": ("install-unterminated", "NUL", "survived unterminated"),
}


def check_bad_handler_whole_run(tmp_path, mode, py=STATIC_PY):
    """Installed with PyDataMem_SetHandler: numpy 1.24 accepts every one of
    them; capsan reports it at the install line. numpy >= 2.1 refuses the
    misnamed capsule itself (ValueError: "Capsule must be named
    'mem_handler'", PR #26529) and installs nothing: nothing to report."""
    tag, word, shows = BAD[mode]
    script = S / "np_bad_handler.py"
    if mode == "misnamed" and numpy_version(py) >= (2, 1):
        for res in (run_plain(script, args=[mode], env=np_env(py), interpreter=py),
                    run_capsan(script, tmp_path, args=[mode], env=np_env(py), interpreter=py)):
            assert res.returncode == 0, getattr(res, "describe", lambda: res.stderr)()
            assert "refused ValueError Capsule must be named 'mem_handler'" in res.stdout
            assert "survived misnamed" in res.stdout
        assert findings(res.report) == [], res.describe()
        return
    native = run_plain(script, args=[mode], env=np_env(py), interpreter=py)
    assert native.returncode == 0 and shows in native.stdout, (native.stdout, native.stderr)
    res = run_capsan(script, tmp_path, args=[mode], env=np_env(py), interpreter=py)
    assert res.returncode == DEFAULT_EXITCODE and shows in res.stdout, res.describe()
    assert kinds(res.report) == {"numpy-bad-handler"}, res.describe()
    f = assert_at(report_findings(res), "numpy-bad-handler", script, tag)
    assert word in f["message"], f["message"]
    # misnamed (numpy #26137): the next allocation fails with MemoryError, which
    # `shows` checks in both runs; whether CPython also chains a SystemError
    # depends on an import racing the pending error, so it is not asserted


@pytest.mark.parametrize("mode", sorted(BAD))
def test_bad_handler_whole_run(tmp_path, mode):
    check_bad_handler_whole_run(tmp_path, mode)


def check_bad_handler_trace(tmp_path, py=STATIC_PY):
    """`import capsan` after numpy: the runtime recognises numpy's
    current_allocator ContextVar by name at its first Set."""
    script = S / "np_bad_handler.py"
    r = run_api(script, tmp_path, args=["v2", "trace"], interpreter=py)
    assert r.returncode == 0 and "survived v2" in r.stdout, r.describe()
    assert_at(r.findings, "numpy-bad-handler", script, "install-v2")


def test_bad_handler_trace(tmp_path):
    check_bad_handler_trace(tmp_path)



@pytest.mark.parametrize("stacks", ["", "python_depth=1", "python_depth=0:native_depth=0"])
def test_module_data_told_from_leaks_in_deep_stacks(tmp_path, stacks):
    """Arrays an extension keeps forever, made 5, 30, 70 and 200 frames deep:
    while a module is imported they are module data, otherwise leaks. The
    import machinery's frames lie below the frames a stack keeps (or there
    are none, stacks off), so the walk of the rest tells; it is remembered
    per thread and proven frame by frame, up to 128 frames, and walked past
    them."""
    script = SCENARIOS / "np_deep_import.py"
    opts = [o for o in stacks.split(":") if o]
    res = run_capsan(script, tmp_path, options=opts, env={"TMPD": str(tmp_path)})
    assert "done" in res.stdout, res.describe()
    leaks = findings(res.report, "numpy-leak")
    assert len(leaks) == 8, summarize(res.report)  # the eight leak() calls, no import
    if not stacks:
        line = marker_line(script, "leak")
        for f in leaks:
            assert events_at(f, script, line, "alloc"), f
