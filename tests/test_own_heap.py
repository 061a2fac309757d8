"""capsan survives the program's heap (issue 43, item 4).

examples/double_delete.py (make demo's step 2) frees a DLPack tensor's data
twice. Before capsan had a heap of its own, glibc had handed the freed data
block to a table of capsan's in between, the second free() gave that table
back to glibc, Python reused it, and capsan's exit handler died in
cs_lc_finish with SIGSEGV (4 runs in 5 on Debian 12), writing no crash
record. Now capsan's memory comes from its own mappings
(preload/core/ownheap.c): the second free() reaches a block glibc knows is
free, glibc aborts in the program's own free() as it does without capsan,
and capsan's crash report is written. Whatever the program's heap does,
the run ends in capsan's exit status or in a crash of the program's own
that capsan recorded, never in one of capsan's.

A second program breaks glibc's heap on purpose and ends with os._exit():
capsan's _exit verdict (the lifecycle, the reachability scan, the report)
runs on top of it, and must not allocate from it.

CAPSAN_HEAP_RUNS sets how many runs of the first (10 by default)."""
import os
import signal

from conftest import (DEFAULT_EXITCODE, ROOT, SCENARIOS, findings, is_signal, process_of,
                      run_capsan, run_plain)

DEMO = ROOT / "examples" / "double_delete.py"
RUNS = int(os.environ.get("CAPSAN_HEAP_RUNS", "10"))


def innermost_crash_frame(stderr: str) -> str:
    """Frame #0 of capsan's crash report ("" without a crash)."""
    head = "native stack of the crashing thread:\n"
    return stderr.split(head, 1)[1].split("\n", 1)[0] if head in stderr else ""


def judge_demo_run(res, i) -> str:
    """One capsan run of the demo: "exit" or "abort" (the program's own),
    never a crash of capsan's."""
    why = f"run {i}:\n{res.describe()}"
    # capsan's exit handler, verdicts and reports never crash
    assert not is_signal(res.returncode, signal.SIGSEGV), why
    assert "libcapsan.so" not in innermost_crash_frame(res.stderr), why
    # the double delete is reported, live and in the trace, every time
    assert "ERROR: capsan: dlpack-double-delete" in res.stderr, why
    assert [f["kind"] for f in findings(res.report)] == ["dlpack-double-delete"], why
    p = process_of(res.report)
    if res.returncode == DEFAULT_EXITCODE:
        # the program reached its end: capsan's verdict at exit
        assert p["ended"] == "exit" and "sum of the batch" in res.stdout, why
        outcome = "exit"
    else:
        # glibc aborted in the program's own second free(), and capsan
        # recorded the crash
        assert is_signal(res.returncode, signal.SIGABRT), why
        assert "double free" in res.stderr, why
        assert "finding(s) reported before the crash" in res.stderr, why
        assert "Python stack of the crashing thread" in res.stderr, why
        assert p["ended"] == "signal" and p["status"] == signal.SIGABRT, why
        outcome = "abort"
    return outcome


def test_double_free_never_crashes_capsan(tmp_path):
    native = run_plain(DEMO)
    assert is_signal(native.returncode, signal.SIGABRT), (native.returncode, native.stderr)
    outcomes = {}
    for i in range(RUNS):
        d = tmp_path / f"run{i}"
        d.mkdir()
        outcome = judge_demo_run(run_capsan(DEMO, d), i)
        outcomes[outcome] = outcomes.get(outcome, 0) + 1
    print(f"{RUNS} runs: {outcomes}")


def test_exit_verdict_needs_no_glibc_heap(tmp_path):
    """Before capsan had its own heap, this aborted in capsan's own realloc
    (livestate.c, as the _exit verdict moved the tensors into the
    lifecycle): every run, with the program's exit status lost."""
    res = run_capsan(SCENARIOS / "heap_poisoned_exit.py", tmp_path)
    why = res.describe()
    assert res.returncode == 0, why  # live-at-exit is a warning: the program's own status
    assert "unaligned tcache chunk" not in res.stderr, why
    p = process_of(res.report)
    assert p["ended"] == "_exit" and p["status"] == 0, why
    live = findings(res.report, "live-at-exit")
    assert len(live) == 3 and {f["object"]["type"] for f in live} == {"DLManagedTensor"}, why
