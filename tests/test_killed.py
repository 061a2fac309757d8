"""A SIGKILLed process (issue 12, items 1 and 2): capsan had no chance to
judge leaks. The trace's crash-safe live state (LIVE records, rewritten in
place as objects come and go) still says what it held: each unreleased
DLPack tensor is a dlpack-leak warning "not released when the process was
killed", each NumPy block a live warning; never an error. `capsan run`
saw its child die, so it adds the END record the child could not write
("ended": "signal", status 9) and prints the report the child could not;
a process killed by another (the fork child below) has none ("ended":
"unknown"), with the same verdict."""
import re
import signal
import subprocess

import pytest

from conftest import (BUILD, CURRENT, PYSHARED, SCENARIOS, STATIC_PY, assert_finding_at, base_env,
                      capsan_report, check_crash_report, crash_reports, findings, is_signal,
                      marker_line, no_core, process_of, run_capsan, summarize, trace_files)

S = SCENARIOS / "killed.py"


def check_killed(res, mode):
    assert f"killing {mode}" in res.stdout, res.describe()
    assert is_signal(res.returncode, signal.SIGKILL), res.describe()
    p = process_of(res.report)
    assert p["ended"] == "signal" and p["status"] == signal.SIGKILL, (p["ended"], p["status"])
    # the child could not print its report: capsan run prints it, then the path
    assert "ended: signal 9 (SIGKILL)" in res.stderr, res.stderr[-3000:]
    assert "WARNING: capsan: dlpack-leak: Unreleased when killed:" in res.stderr, res.stderr[-3000:]
    assert res.stderr.rstrip().splitlines()[-1].startswith("capsan: "), res.stderr[-3000:]
    assert "killed by signal 9; trace:" in res.stderr.rstrip().splitlines()[-1], res.stderr[-3000:]
    assert p["summary"]["errors"] == 0, summarize(res.report)
    assert all(f["severity"] == "warning" for f in findings(res.report)), summarize(res.report)
    leaks = findings(res.report, "dlpack-leak")
    assert len(leaks) == 1, summarize(res.report)
    assert "not released when the process was killed" in leaks[0]["message"], leaks[0]
    return leaks[0]


def test_killed_after_a_leak(tmp_path, anypy):
    res = run_capsan(S, tmp_path, args=["leak"], interpreter=anypy)
    f = check_killed(res, "leak")
    assert f["bytes"] == 32, f
    assert_finding_at(res, "dlpack-leak", S, "consume-leak", event="consume", innermost=False)
    live = findings(res.report, "live-at-exit")
    assert any(x["bytes"] == 32 for x in live), summarize(res.report)
    assert_finding_at(res, "live-at-exit", S, "alloc", event="alloc", innermost=False)


def test_killed_holding_a_clean_tensor(tmp_path, anypy):
    if anypy not in (STATIC_PY, PYSHARED, CURRENT.get("cp311")):
        pytest.skip("torch is installed for Debian's python and the cp311 venv only")
    res = run_capsan(S, tmp_path, args=["clean"], interpreter=anypy)
    f = check_killed(res, "clean")
    assert f["bytes"] == 64, f
    assert_finding_at(res, "dlpack-leak", S, "held", event="export", innermost=False)


def test_killed_fork_child_judges_its_own(tmp_path, interp):
    res = run_capsan(S, tmp_path, args=["fork"], interpreter=interp)
    assert res.returncode == 0 and "signal 9" in res.stdout, res.describe()
    procs = res.report["processes"]
    assert len(procs) == 2, summarize(res.report)
    parent = [p for p in procs if p["ended"] == "exit"]
    child = [p for p in procs if p["ended"] == "unknown"]
    assert len(parent) == 1 and len(child) == 1, summarize(res.report)
    assert parent[0]["findings"] == [], summarize(res.report)
    leaks = [f for f in child[0]["findings"] if f["kind"] == "dlpack-leak"]
    assert len(leaks) == 1 and leaks[0]["severity"] == "warning", summarize(res.report)
    assert_finding_at(res, "dlpack-leak", S, "child-leak", event="consume", innermost=False)
    # the parent's view is the parent's: not among the child's warnings
    assert not any(f["kind"] == "dlpack-leak" and f is not leaks[0] for f in child[0]["findings"])


@pytest.mark.parametrize("how", ["abort", "segv"])
def test_a_crash_says_its_fault_address_only_for_a_fault(tmp_path, how):
    """SIGSEGV from a NULL read says the faulting address (0x0), live and
    in the report; abort() sends SIGABRT, whose siginfo holds no address,
    so neither says one."""
    res = run_capsan(SCENARIOS / "crash_kinds.py", tmp_path, args=[how])
    sig = signal.SIGABRT if how == "abort" else signal.SIGSEGV
    assert f"crashing {how}" in res.stdout and is_signal(res.returncode, sig), res.describe()
    line = next((ln for ln in res.stderr.splitlines() if " at pc 0x" in ln and "capsan:" in ln), "")
    assert line, res.stderr[-3000:]
    text, _ = capsan_report(trace_files(tmp_path), fmt="text")
    ended = next((ln for ln in text.stdout.splitlines() if ln.strip().startswith("at pc 0x")), "")
    assert ended, text.stdout[-3000:]
    if how == "abort":
        assert "(address" not in line and "fault address" not in ended, (line, ended)
    else:
        assert line.endswith("(address 0x0)"), line
        assert ended.endswith("fault address 0x0"), ended


REDIRECTED = '''
import ctypes
import os
import sys

mode, log = sys.argv[1], sys.argv[2]
f = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
if mode == "dup2":
    os.dup2(f, 2)  # the program's own log from now on
elif mode == "closed":
    os.closerange(3, 1 << 20)  # capsan's copy of the stderr it started with too
elif mode == "reused":
    # the program's file dup2'd over every other descriptor of its stderr
    # (capsan's copy among them): written into only if it were that file
    mine, replaced = os.readlink("/proc/self/fd/2"), 0
    for name in os.listdir("/proc/self/fd"):
        fd = int(name)
        try:
            if fd > 2 and fd != f and os.readlink(f"/proc/self/fd/{fd}") == mine:
                os.dup2(f, fd)
                replaced += 1
        except OSError:
            pass
    print("replaced", replaced)


def crash():
    print("crashing", flush=True)
    ctypes.string_at(0)  # <-- crash


crash()  # <-- call
'''


@pytest.mark.parametrize("mode", ["dup2", "closed", "reused"])
def test_a_crash_is_told_on_the_stderr_the_process_started_with(tmp_path, mode):
    """capsan keeps a copy of the stderr the process had when it started:
    a program that moves fd 2 to a log of its own before it crashes still
    has capsan's crash report on the terminal (capture_output here), once,
    and in its log as well. A program that closed the copy (it closes
    every descriptor) gets the report on fd 2; one that put a file of its
    own at the copy's number keeps that file as it was."""
    log = tmp_path / "program.log"
    res = run_capsan(REDIRECTED, tmp_path, args=[mode, log])
    script = tmp_path / "prog_0.py"
    assert "crashing" in res.stdout and is_signal(res.returncode, signal.SIGSEGV), res.describe()
    frame = f"{script.name}:{marker_line(script, 'crash')} in crash"
    rep, trace = check_crash_report(res.stderr, "SEGV", frame)
    assert re.search(r"==\d+==capsan: Segmentation fault at pc 0x[0-9a-f]+ \(address 0x0\)\n", rep)
    assert f"{script.name}:{marker_line(script, 'call')} in <module>" in rep, rep
    assert trace in res.traces, (trace, res.traces)
    assert process_of(res.report)["ended"] == "signal", summarize(res.report)
    text = log.read_text()
    if mode == "reused":
        assert "replaced 1" in res.stdout, res.stdout
    if mode == "dup2":
        assert crash_reports(text) == [rep], text
    else:
        assert "capsan" not in text, text


def test_a_crash_before_any_event_still_leaves_a_trace(tmp_path):
    """`import capsan` (a late start, no LD_PRELOAD) and a crash before
    capsan saw any event: no record had opened the trace, so the handler
    opens it, and the report names it (it used to print "trace: " and an
    empty path)."""
    script = tmp_path / "late.py"
    script.write_text("import ctypes\n"
                      "import capsan\n"
                      "assert capsan.active() and not capsan.preloaded()\n"
                      "ctypes.string_at(0)  # <-- crash\n")
    env = base_env({"CAPSAN_OPTIONS": f"log_path={tmp_path / 't'}",
                    "PYTHONPATH": f"{BUILD / 'python'}"})
    cp = subprocess.run([str(STATIC_PY), str(script)], capture_output=True, text=True, env=env,
                        timeout=120, stdin=subprocess.DEVNULL, preexec_fn=no_core)
    assert is_signal(cp.returncode, signal.SIGSEGV), cp.stderr[-3000:]
    rep, trace = check_crash_report(cp.stderr, "SEGV", f"late.py:{marker_line(script, 'crash')} "
                                    "in <module>")
    assert trace_files(tmp_path) == [trace], trace_files(tmp_path)
    assert "0 finding(s) reported before the crash" in rep, rep


NESTED = '''
import os
import sys


def inner():
    os.abort()  # <-- abort


def outer():
    inner()  # <-- outer


print("crashing", flush=True)
outer()
'''


def test_the_crash_report_names_the_python_lines(tmp_path, anypy):
    """The crashing thread's Python frames, read from the signal handler
    without the GIL or any call but PyCode_Addr2Line, on every CPython's
    frame layout (3.10's frame objects, 3.11-3.13's interpreter frames)."""
    res = run_capsan(NESTED, tmp_path, interpreter=anypy)
    script = tmp_path / "prog_0.py"
    assert "crashing" in res.stdout and is_signal(res.returncode, signal.SIGABRT), res.describe()
    rep, _ = check_crash_report(res.stderr, "ABRT", f"{script.name}:{marker_line(script, 'abort')} "
                                "in inner")
    py = rep.split("innermost first:\n")[1].splitlines()
    assert py[0].endswith(f"{script.name}:{marker_line(script, 'abort')} in inner"), rep
    assert py[1].endswith(f"{script.name}:{marker_line(script, 'outer')} in outer"), rep
    assert "raised by the process itself" in rep and "(address" not in rep, rep
