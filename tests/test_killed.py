"""A SIGKILLed process (issue 12, items 1 and 2): capsan had no chance to
judge leaks. The trace's crash-safe live state (LIVE records, rewritten in
place as objects come and go) still says what it held: each unreleased
DLPack tensor is a dlpack-leak warning "not released when the process was
killed", each NumPy block a live warning; never an error. `capsan run`
saw its child die, so it adds the END record the child could not write
("ended": "signal", status 9) and prints the report the child could not;
a process killed by another (the fork child below) has none ("ended":
"unknown"), with the same verdict."""
import signal

import pytest

from conftest import (CURRENT, PYSHARED, SCENARIOS, STATIC_PY, assert_finding_at, capsan_report,
                      findings, is_signal, process_of, run_capsan, summarize, trace_files)

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
