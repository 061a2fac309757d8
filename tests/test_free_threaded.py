"""Free-threaded semantics (issue 43, item 3), on the free-threaded 3.13t
(`make newest`; skipped where there is none) with the GIL really off.

- The GIL kinds there mean a thread without an attached thread state, and
  say so, live and in `capsan report`; Debian's GIL build keeps the old
  words.
- Races the free-threaded build makes possible at capsan's seams, each
  committed for real by tests/fixtures/ftrace.c from two Python threads
  (tests/scenarios/ft_races.py), with a rendezvous that makes the race
  certain rather than likely: one DLPack capsule consumed by two threads
  at once, one Arrow stream's get_next on two threads at once, its
  release under another thread's get_next.
- NumPy's handler ContextVar and threads that do or do not inherit their
  starter's context (tests/scenarios/ft_handlers.py).

CAPSAN_REPEAT=N runs each finding's scenario N times beside a busy loop on
every core (3 by default) and asks for one verdict."""
import collections
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import (SCENARIOS, STATIC_PY, assert_finding_at, capsan_report, findings, kinds,
                      marker_line, newest_python, run_capsan, run_newest, summarize, trace_files)

GIL = SCENARIOS / "gil_calls.py"
NUMPY_NOGIL = SCENARIOS / "np_nogil_numpy.py"
RACES = SCENARIOS / "ft_races.py"
HANDLERS = SCENARIOS / "ft_handlers.py"
RUNS = int(os.environ.get("CAPSAN_REPEAT") or 3)

FT_WORDS = "without an attached thread state (free-threaded build: PyGILState_Check() == 0)"


def ft():
    n = newest_python("cp313t")
    assert n.free_threaded
    return n


def gil_was_off(res):
    assert "gil=False" in res.stdout or '"gil": false' in res.stdout, res.describe()
    assert "global interpreter lock (GIL) has been enabled" not in res.stderr, res.describe()


def with_gil_line(script: Path, tmp: Path, *args) -> Path:
    """A launcher that prints whether the GIL is on, then runs `script`
    under its own name (its lines stay its own)."""
    p = tmp / "launch.py"
    p.write_text("import runpy, sys\n"
                 "print('gil=%s' % (sys._is_gil_enabled() if hasattr(sys, '_is_gil_enabled') "
                 "else True), flush=True)\n"
                 f"sys.argv = [{str(script)!r}, *{list(args)!r}]\n"
                 f"runpy.run_path({str(script)!r}, run_name='__main__')\n")
    return p


def text_report(res) -> str:
    from conftest import CAPSAN
    cp = subprocess.run([str(CAPSAN), "report", "--format", "text", *map(str, res.traces)],
                        capture_output=True, text=True, timeout=120)
    return cp.stdout + cp.stderr


# ---- 1. the GIL kinds' words ----

def test_capsule_no_gil_speaks_of_the_thread_state(tmp_path):
    n = ft()
    res = run_newest(n, with_gil_line(GIL, tmp_path, "capsule-numpy"), tmp_path)
    assert res.returncode == 0 and "done" in res.stdout, res.describe()
    gil_was_off(res)
    f = assert_finding_at(res, "capsule-no-gil", GIL, "nogil-capsule-numpy", event="call")
    assert kinds(res.report) == {"capsule-no-gil"}, summarize(res.report)
    # offline: capsan report rendered it from the trace
    assert FT_WORDS in f["message"] and "attach one with PyGILState_Ensure" in f["message"], f
    assert "GIL" not in f["message"].replace("PyGILState", ""), f["message"]
    # live: the runtime's own report
    assert "capsule-no-gil: a PyCapsule function was called " + FT_WORDS in res.stderr
    assert "called without an attached thread state at" in res.stderr, res.stderr[-3000:]
    text = text_report(res)
    assert FT_WORDS in text and "called without an attached thread state at" in text, text


def test_capsule_no_gil_keeps_the_gil_words_on_a_gil_build(tmp_path):
    res = run_capsan(GIL, tmp_path, args=["capsule-numpy"], interpreter=STATIC_PY)
    assert res.returncode == 0, res.describe()
    f = assert_finding_at(res, "capsule-no-gil", GIL, "nogil-capsule-numpy", event="call")
    assert f["message"] == ("a PyCapsule function was called without holding the GIL "
                            "(PyGILState_Check() == 0): take it with PyGILState_Ensure first"), f
    assert "called without the GIL at" in res.stderr and "attached" not in res.stderr


def test_numpy_handler_no_gil_speaks_of_the_thread_state(tmp_path):
    """numpy 2.4's fromfile(sep=) calls the handler detached on 3.13t too."""
    n = ft()
    res = run_newest(n, with_gil_line(NUMPY_NOGIL, tmp_path), tmp_path)
    assert res.returncode == 0 and "read 5000" in res.stdout, res.describe()
    gil_was_off(res)
    f = assert_finding_at(res, "numpy-handler-no-gil", NUMPY_NOGIL, "fromfile", event="call",
                          innermost=False)
    assert "without an attached thread state (free-threaded build" in f["message"], f["message"]
    for g in findings(res.report):
        assert "the GIL" not in g["message"], g["message"]


DELETER = '''
import ctypes, sys
import nogil
print("gil=%s" % sys._is_gil_enabled())
api = ctypes.pythonapi
api.PyCapsule_GetPointer.restype = ctypes.c_void_p
api.PyCapsule_GetPointer.argtypes = [ctypes.py_object, ctypes.c_char_p]
api.PyCapsule_SetName.argtypes = [ctypes.py_object, ctypes.c_char_p]
cap = nogil.export_bad_deleter()
mt = api.PyCapsule_GetPointer(cap, b"dltensor")
api.PyCapsule_SetName(cap, b"used_dltensor")
# DLManagedTensor: dl_tensor (48 bytes), manager_ctx, deleter
deleter = ctypes.CFUNCTYPE(None, ctypes.c_void_p)(ctypes.c_void_p.from_address(mt + 56).value)
deleter(mt)  # <-- detached
print("done")
'''


def test_deleter_no_gil_speaks_of_the_thread_state(tmp_path):
    """A consumer calls the deleter through ctypes, which detaches the
    thread state around foreign calls; the deleter then uses the C API."""
    n = ft()
    script = tmp_path / "deleter.py"
    script.write_text(DELETER)
    res = run_newest(n, script, tmp_path)
    assert res.returncode == 23 and "done" in res.stdout, res.describe()
    gil_was_off(res)
    f = assert_finding_at(res, "dlpack-deleter-no-gil", script, "detached", event="call",
                          innermost=False)
    assert kinds(res.report) == {"dlpack-deleter-no-gil"}, summarize(res.report)
    assert FT_WORDS in f["message"] and "(R12)" in f["message"], f["message"]


XNOGIL = """
import sys
import xkernel, xproducer
print("gil=%s" % sys._is_gil_enabled())
print(xkernel.total_nogil(xproducer.Blob(4)))  # <-- nogil
print("done")
"""


def test_exchange_contract_gil_clause_speaks_of_the_thread_state(tmp_path):
    """A kernel calls a producer's from_py detached (R56)."""
    n = ft()
    script = tmp_path / "xnogil.py"
    script.write_text(XNOGIL)
    res = run_newest(n, script, tmp_path)
    assert res.returncode == 23 and "6.0" in res.stdout and "done" in res.stdout, res.describe()
    gil_was_off(res)
    f = assert_finding_at(res, "dlpack-exchange-contract", script, "nogil", event="exchange-call",
                          innermost=False)
    assert kinds(res.report) == {"dlpack-exchange-contract"}, summarize(res.report)
    assert ("managed_tensor_from_py_object_no_sync was called without an attached thread state "
            "(free-threaded build" in f["message"]), f["message"]
    assert "the GIL" not in f["message"], f["message"]


# ---- 2. races ----

def race(tmp_path, mode, options=("protect=1",)):
    n = ft()
    res = run_newest(n, RACES, tmp_path, args=[mode], options=list(options), timeout=120)
    gil_was_off(res)
    return res


def test_one_capsule_consumed_by_two_threads(tmp_path):
    """Both threads took the pointer, both renamed: the second rename is a
    reconsume at its own line, the first consume at its; both holders then
    call the deleter (the second skipped, protect=1)."""
    res = race(tmp_path, "double-consume")
    assert res.returncode == 23 and "done" in res.stdout, res.describe()
    assert kinds(res.report) == {"dlpack-reconsume", "dlpack-double-delete"}, summarize(res.report)
    f = assert_finding_at(res, "dlpack-reconsume", RACES, "consume-second", event="consume")
    assert_finding_at(res, "dlpack-reconsume", RACES, "consume-first", event="consume")
    assert_finding_at(res, "dlpack-reconsume", RACES, "export", event="export")
    threads = {e["thread"] for e in f["events"] if e["event"] == "consume"}
    assert len(threads) == 2, f["events"]
    assert_finding_at(res, "dlpack-double-delete", RACES, "consume-second", event="consume")


def test_one_capsule_consumed_under_a_critical_section_is_clean(tmp_path):
    res = race(tmp_path, "locked-consume", options=())
    assert res.returncode == 0 and "done" in res.stdout, res.describe()
    assert findings(res.report) == [], summarize(res.report)


def test_one_stream_read_by_two_threads(tmp_path):
    res = race(tmp_path, "stream-next", options=())
    assert res.returncode == 23 and "done" in res.stdout, res.describe()
    assert kinds(res.report) == {"arrow-stream-misuse"}, summarize(res.report)
    f = assert_finding_at(res, "arrow-stream-misuse", RACES, "next", event="get-next")
    assert_finding_at(res, "arrow-stream-misuse", RACES, "export-stream", event="export")
    assert "get_next of ArrowArrayStream" in f["message"], f["message"]


def test_one_stream_released_under_another_threads_get_next(tmp_path):
    res = race(tmp_path, "stream-release", options=())
    assert res.returncode == 23 and "done" in res.stdout, res.describe()
    assert kinds(res.report) == {"arrow-stream-misuse"}, summarize(res.report)
    f = assert_finding_at(res, "arrow-stream-misuse", RACES, "release-racing", event="release")
    assert_finding_at(res, "arrow-stream-misuse", RACES, "export-slow", event="export")
    assert f["message"].startswith("release of ArrowArrayStream"), f["message"]
    assert "now runs on a released stream" in f["message"], f["message"]


# ---- 2c. NumPy's handler ContextVar and threads ----

def handlers(tmp_path, mode):
    n = ft()
    res = run_newest(n, HANDLERS, tmp_path, args=[mode], timeout=180)
    gil_was_off(res)
    out = json.loads([ln for ln in res.stdout.splitlines() if ln.startswith("{")][-1])
    return res, out


def test_thread_without_the_starters_context_allocates_outside_the_scope(tmp_path):
    """3.13t: the thread starts on numpy's default handler, so the scope's
    tracing handler made nothing of it; the process's end reports the
    block the thread leaked, at the thread's line."""
    res, out = handlers(tmp_path, "fresh")
    assert out["inherit_flag"] is None  # 3.13t has no sys.flags.thread_inherit_context
    assert out["scope_handler"] == "capsan(default_allocator)", out
    assert out["thread_handler"] == "default_allocator", out
    assert out["scope"] == [], out
    assert res.returncode == 23, res.describe()
    assert kinds(res.report) == {"numpy-leak"}, summarize(res.report)
    assert_finding_at(res, "numpy-leak", HANDLERS, "thread-leak", event="alloc", innermost=False)


def test_thread_in_the_starters_context_allocates_in_the_scope(tmp_path):
    """What 3.14t does by default (thread_inherit_context): the thread's
    block comes from the scope's tracing handler, and the scope reports
    its leak at the thread's line, once (not again at the end)."""
    res, out = handlers(tmp_path, "inherit")
    assert out["thread_handler"] == out["scope_handler"] == "capsan(default_allocator)", out
    line = marker_line(HANDLERS, "thread-leak")
    assert out["scope"] == [["numpy-leak", f"{HANDLERS.name}:{line}"]], out
    assert res.returncode == 23, res.describe()
    assert len(findings(res.report)) == 1 and kinds(res.report) == {"numpy-leak"}, summarize(
        res.report)
    assert_finding_at(res, "numpy-leak", HANDLERS, "thread-leak", event="alloc", innermost=False)


def test_blocks_freed_on_other_threads_after_their_handler_scope(tmp_path):
    res, out = handlers(tmp_path, "cross")
    assert out["mine_block"] == "mine" and out["thread_handler"] == "default_allocator", out
    assert out["traced_block"] == "capsan(default_allocator)", out
    assert out["scope"] == [] and out["after"] == "default_allocator", out
    assert res.returncode == 0 and "done" in res.stdout, res.describe()
    assert findings(res.report) == [], summarize(res.report)


# ---- the same verdict every run, the machine loaded ----

def verdict(res, script):
    """exit status, and each finding's kind with the Python lines of
    `script` its events name, in order"""
    got = []
    for f in findings(res.report):
        lines = tuple(fr["line"] for e in f["events"] for fr in e["stack"]
                      if fr.get("python") and Path(fr["file"]).name == script.name)
        got.append((f["kind"], lines))
    return res.returncode, tuple(sorted(got))


@pytest.mark.parametrize("script, mode, options", [
    (RACES, "double-consume", ["protect=1"]),
    (RACES, "locked-consume", []),
    (RACES, "stream-next", []),
    (RACES, "stream-release", []),
    (HANDLERS, "fresh", []),
    (HANDLERS, "inherit", []),
    (HANDLERS, "cross", []),
])
def test_same_verdict_every_run(tmp_path, hog, script, mode, options):
    n = ft()
    seen = collections.Counter()
    for i in range(RUNS):
        res = run_newest(n, script, tmp_path / str(i), args=[mode], options=options, timeout=300)
        assert res.report is not None or res.returncode == 0, res.describe()
        gil_was_off(res)
        seen[verdict(res, script)] += 1
    assert len(seen) == 1, f"{len(seen)} verdicts in {RUNS} runs: {seen}"
