"""Every dlpack-* finding kind, committed for real by a fixture extension
driven from a scenario script, and the options that shape what happens next
(protect, halt_on_error, exitcode, help, unknown keys).

Each finding test asserts the kind, the script line (found by its
`# <-- tag` marker) of the event that matters, the exit status and the
LeakSanitizer-style text on stderr.
"""
import json
import signal
import subprocess
import time

import pytest

from conftest import (CAPSAN, DEFAULT_EXITCODE, LIBCAPSAN, SCENARIOS, STATIC_PY, Result,
                      assert_finding_at, check_schema, assert_lsan_stderr, base_env, capsan_report,
                      contract_kinds, contract_options, current_python, findings, is_signal, kinds, marker_line,
                      process_of, require_fixtures, require_runtime, run_capsan, run_plain, trace_files,
                      events_at)

S = SCENARIOS


def severity_of(kind):
    return dict(contract_kinds())[kind]


def only_kinds(res, expected):
    got = kinds(res.report)
    assert got == set(expected), f"expected exactly {sorted(expected)}, got {sorted(got)}\n{res.describe()}"


def error_exit(res):
    assert res.returncode == DEFAULT_EXITCODE, (
        f"expected exit status {DEFAULT_EXITCODE} (error findings)\n{res.describe()}")


# ---------------------------------------------------------------- double delete

@pytest.mark.parametrize("variant", ["legacy", "versioned"])
def test_double_delete(tmp_path, anypy, variant):
    script = S / "dl_double_delete.py"
    sfx = "-v" if variant == "versioned" else ""
    res = run_capsan(script, tmp_path, options=["protect=1"], interpreter=anypy, args=[variant])
    error_exit(res)
    # protect=1 skipped the second deleter call: the program carried on, released once
    assert "survived 28.0 1" in res.stdout, res.describe()
    f = assert_finding_at(res, "dlpack-double-delete", script, "delete" + sfx, event="delete")
    assert f["severity"] == "error"
    assert f["object"]["type"] == ("DLManagedTensorVersioned" if sfx else "DLManagedTensor"), f["object"]
    # the history names the export line too
    assert_finding_at(res, "dlpack-double-delete", script, "export" + sfx, event="export")
    dels = [e for e in f["events"] if e["event"] == "delete"]
    assert len(dels) >= 2, f"a double delete needs two delete events: {f['events']}"
    # native frames are merged in and symbolized: the consumer's C function is named
    fn = "double_delete_versioned" if sfx else "double_delete"
    assert any(not fr["python"] and fr.get("function") == fn
               and str(fr.get("module", "")).endswith("dlconsumer.so")
               for fr in dels[-1]["stack"]), [fr.get("function") for fr in dels[-1]["stack"]]
    only_kinds(res, ["dlpack-double-delete"])
    assert_lsan_stderr(res.stderr, "dlpack-double-delete")
    assert process_of(res.report)["ended"] == "exit"


def test_double_delete_without_protect_really_crashes(tmp_path):
    """protect=0: the second deleter call runs, glibc aborts on the double free;
    capsan reported the finding before the crash, and the trace still has it."""
    script = S / "dl_double_delete.py"
    native = run_plain(script, args=["legacy"])
    assert is_signal(native.returncode, signal.SIGABRT), (native.returncode, native.stderr)
    assert "double free" in native.stderr
    res = run_capsan(script, tmp_path, args=["legacy"])
    assert is_signal(res.returncode, signal.SIGABRT), res.describe()
    assert "survived" not in res.stdout
    assert_finding_at(res, "dlpack-double-delete", script, "delete", event="delete")
    assert "dlpack-double-delete" in res.stderr, "finding not printed before the crash\n" + res.describe()
    p = process_of(res.report)
    assert p["ended"] == "signal" and p["status"] == signal.SIGABRT, p


# ---------------------------------------------------------------- unchecked destructor

def test_unchecked_destructor(tmp_path, anypy):
    """The consumer keeps the tensor; the producer's destructor releases it anyway."""
    script = S / "dl_unchecked.py"
    res = run_capsan(script, tmp_path, interpreter=anypy, args=["consume_leak"])
    error_exit(res)
    assert "survived 1" in res.stdout, res.describe()
    assert_finding_at(res, "dlpack-unchecked-destructor", script, "destroy", event="delete")
    assert_finding_at(res, "dlpack-unchecked-destructor", script, "consume-leak", event="consume")
    # the deleter did run (in the destructor): the tensor is not leaked
    only_kinds(res, ["dlpack-unchecked-destructor"])
    assert_lsan_stderr(res.stderr, "dlpack-unchecked-destructor")


def test_unchecked_destructor_after_release_protected(tmp_path):
    """Consumer released, destructor releases again: skipped with protect=1."""
    script = S / "dl_unchecked.py"
    res = run_capsan(script, tmp_path, options=["protect=1"], args=["consume_good"])
    error_exit(res)
    assert "survived 1" in res.stdout, res.describe()
    assert_finding_at(res, "dlpack-unchecked-destructor", script, "destroy", event="delete")
    only_kinds(res, ["dlpack-unchecked-destructor"])
    assert_lsan_stderr(res.stderr, "dlpack-unchecked-destructor")


def test_unchecked_destructor_unprotected_crashes(tmp_path):
    script = S / "dl_unchecked.py"
    native = run_plain(script, args=["consume_good"])
    assert is_signal(native.returncode, signal.SIGABRT), (native.returncode, native.stderr)
    res = run_capsan(script, tmp_path, args=["consume_good"])
    assert is_signal(res.returncode, signal.SIGABRT), res.describe()
    assert_finding_at(res, "dlpack-unchecked-destructor", script, "destroy", event="delete")


# ---------------------------------------------------------------- not renamed

def test_not_renamed(tmp_path, anypy):
    script = S / "dl_not_renamed.py"
    res = run_capsan(script, tmp_path, options=["protect=1"], interpreter=anypy)
    error_exit(res)
    # the destructor's second release was skipped: one deleter call in all
    assert "survived 1" in res.stdout, res.describe()
    assert_finding_at(res, "dlpack-not-renamed", script, "delete", event="delete")
    # the predicted double delete is explained by not-renamed, not reported twice
    only_kinds(res, ["dlpack-not-renamed"])
    assert len(findings(res.report, "dlpack-not-renamed")) == 1
    assert_lsan_stderr(res.stderr, "dlpack-not-renamed")


def test_not_renamed_without_protect_really_crashes(tmp_path):
    script = S / "dl_not_renamed.py"
    native = run_plain(script)
    assert is_signal(native.returncode, signal.SIGABRT), (native.returncode, native.stderr)
    res = run_capsan(script, tmp_path)
    assert is_signal(res.returncode, signal.SIGABRT), res.describe()
    assert_finding_at(res, "dlpack-not-renamed", script, "delete", event="delete")
    assert "dlpack-not-renamed" in res.stderr, "finding not printed before the crash\n" + res.describe()


# ---------------------------------------------------------------- reconsume

def test_reconsume(tmp_path, anypy):
    script = S / "dl_reconsume.py"
    res = run_capsan(script, tmp_path, interpreter=anypy)
    error_exit(res)
    assert "sums 28.0 True deleted 1" in res.stdout, res.describe()
    assert_finding_at(res, "dlpack-reconsume", script, "reconsume")
    only_kinds(res, ["dlpack-reconsume"])
    assert_lsan_stderr(res.stderr, "dlpack-reconsume")
    pid = process_of(res.report)["pid"]
    assert f"=={pid}==ERROR: capsan: dlpack-reconsume" in res.stderr, res.stderr
    line = marker_line(script, "reconsume")
    assert f"dl_reconsume.py:{line}" in res.stderr, res.stderr


def test_owner_reading_its_consumed_capsule_is_clean(tmp_path, anypy):
    """The consumer that keeps its consumed capsules and releases at cleanup
    by the consumed name uses what it owns: no dlpack-reconsume."""
    script = S / "dl_owner_cleanup.py"
    res = run_capsan(script, tmp_path, interpreter=anypy)
    assert res.returncode == 0, res.describe()
    assert "kept [28.0, 28.0] released 2 deleted 1" in res.stdout, res.describe()
    assert findings(res.report) == [], res.describe()


def test_reconsume_after_rename_back(tmp_path, anypy):
    """No finding precedes this one: capsan must still look the tensor up
    when a capsule was given an unconsumed name again. The released struct
    waits in quarantine (its free deferred), so the second consumer reads
    it whole, not freed memory glibc's free list wrote over, and its second
    release reaches capsan: reported, and skipped with protect=1."""
    script = S / "dl_renamed_back.py"
    res = run_capsan(script, tmp_path, options=["protect=1"], interpreter=anypy)
    error_exit(res)
    assert "consumed twice 28.0" in res.stdout, res.describe()
    # the read through the capsule that claims to be unused
    assert_finding_at(res, "dlpack-reconsume", script, "reconsume", event="reconsume")
    # its deleter runs again through the trampoline left in the struct
    assert_finding_at(res, "dlpack-double-delete", script, "reconsume", event="delete")
    only_kinds(res, ["dlpack-reconsume", "dlpack-double-delete"])


def test_released_struct_reused_without_quarantine_crashes(tmp_path):
    """The bug quarantine is for: a producer's destructor releases a tensor
    its consumer holds and frees the struct; malloc hands the block to the
    next request, and the consumer's release jumps through what it holds
    now. Where the block is reused that is a SIGSEGV; where glibc coalesced
    it instead, an abort on the data's double free. Which one depends on the
    heap's layout, which the environment's size alone moves (a checkout at
    another path turned Debian's python3 from the first to the second):
    natively and with quarantine_count=0 the program dies either way, and no
    double delete can be reported."""
    script = S / "dl_released_reused.py"
    crashed = lambda rc: is_signal(rc, signal.SIGSEGV) or is_signal(rc, signal.SIGABRT)
    native = run_plain(script)
    assert crashed(native.returncode), (native.returncode, native.stderr)
    assert "released" not in native.stdout
    res = run_capsan(script, tmp_path, options=["quarantine_count=0"])
    assert crashed(res.returncode), res.describe()
    assert kinds(res.report) == {"dlpack-unchecked-destructor"}, res.describe()


def test_released_struct_quarantined(tmp_path, anypy):
    """With the struct in quarantine (the default) the consumer's release
    lands in capsan's trampoline, whatever the heap did: dlpack-double-delete
    at its line, printed before the producer's deleter runs again (unprotected,
    it frees the data a second time, which the quarantine does not hold:
    glibc aborts when it notices)."""
    script = S / "dl_released_reused.py"
    res = run_capsan(script, tmp_path, interpreter=anypy)
    assert is_signal(res.returncode, signal.SIGABRT) or res.returncode == DEFAULT_EXITCODE, (
        res.describe())
    assert "held 28.0" in res.stdout, res.describe()
    f = assert_finding_at(res, "dlpack-double-delete", script, "release", event="delete")
    assert "dlpack-unchecked-destructor" in f["message"], f["message"]
    assert_finding_at(res, "dlpack-unchecked-destructor", script, "destroy", event="delete")
    assert "ERROR: capsan: dlpack-double-delete" in res.stderr, res.describe()
    if "double free" in res.stderr:
        assert res.stderr.index("dlpack-double-delete") < res.stderr.index("double free")
    assert kinds(res.report) == {"dlpack-unchecked-destructor", "dlpack-double-delete"}


def test_released_struct_protected(tmp_path, anypy):
    """protect=1 skips the destructor's release: the consumer's is the
    only one, and the program survives."""
    script = S / "dl_released_reused.py"
    res = run_capsan(script, tmp_path, options=["protect=1"], interpreter=anypy)
    error_exit(res)
    assert "released 1" in res.stdout and "survived 1" in res.stdout, res.describe()
    only_kinds(res, ["dlpack-unchecked-destructor"])


# ---------------------------------------------------------------- leak

def test_leak_consumed_never_deleted(tmp_path, anypy):
    script = S / "dl_leak.py"
    res = run_capsan(script, tmp_path, interpreter=anypy, args=["consumed"])
    error_exit(res)
    assert "deleted 0" in res.stdout
    f = assert_finding_at(res, "dlpack-leak", script, "consume", event="consume")
    assert_finding_at(res, "dlpack-leak", script, "export", event="export")
    assert f["bytes"] == 32, f"8 float32 leaked = 32 bytes, report says {f['bytes']}"
    p = process_of(res.report)
    assert p["summary"]["leaked_bytes"] >= 32, p["summary"]
    assert p["summary"]["errors"] >= 1
    only_kinds(res, ["dlpack-leak"])
    assert_lsan_stderr(res.stderr, "dlpack-leak")


def test_leak_capsule_without_destructor(tmp_path, anypy):
    script = S / "dl_leak.py"
    res = run_capsan(script, tmp_path, interpreter=anypy, args=["no_destructor"])
    error_exit(res)
    f = assert_finding_at(res, "dlpack-leak", script, "export-nodtor", event="export")
    assert_finding_at(res, "dlpack-leak", script, "destroy-nodtor", event="destroy")
    assert f["bytes"] == 32, f
    only_kinds(res, ["dlpack-leak"])
    assert_lsan_stderr(res.stderr, "dlpack-leak")


# ---------------------------------------------------------------- NULL deleter

def test_null_deleter_export_is_legal(tmp_path, anypy):
    """A NULL deleter is legal (R10) and a careful consumer checks it: no
    finding, exit status 0; verbosity=1 notes the export. A NULL-deleter
    tensor cannot be released by anyone, so it is no leak either."""
    script = S / "dl_null_deleter.py"
    assert severity_of("dlpack-null-deleter") == "error"
    res = run_capsan(script, tmp_path, interpreter=anypy, args=["checked"])
    assert res.returncode == 0, res.describe()
    assert "survived" in res.stdout
    assert findings(res.report) == [], res.describe()
    assert process_of(res.report)["summary"]["events"] > 0
    noted = run_capsan(script, tmp_path / "v", interpreter=anypy, args=["checked"],
                       options=["verbosity=1"])
    assert noted.returncode == 0 and "exported with a NULL deleter" in noted.stderr, noted.describe()


def test_static_null_deleter_lent_again_is_clean(tmp_path, anypy):
    """The same static struct exported and consumed three times: three
    loans, not a reconsume."""
    script = S / "dl_null_deleter.py"
    res = run_capsan(script, tmp_path, interpreter=anypy, args=["static"])
    assert res.returncode == 0, res.describe()
    assert "total 24.0" in res.stdout, res.stdout
    assert findings(res.report) == [], res.describe()


def test_null_deleter_call_segfaults(tmp_path, anypy):
    """The consumer calls a NULL deleter: a real SIGSEGV, and before the
    process dies, a dlpack-null-deleter error tied to the tensor: its
    export, its consume and the call, each at its Python line."""
    script = S / "dl_null_deleter.py"
    native = run_plain(script, interpreter=anypy, args=["crash"])
    assert is_signal(native.returncode, signal.SIGSEGV), (native.returncode, native.stderr)
    res = run_capsan(script, tmp_path, interpreter=anypy, args=["crash"])
    assert is_signal(res.returncode, signal.SIGSEGV), res.describe()
    assert "calling" in res.stdout and "not reached" not in res.stdout
    f = assert_finding_at(res, "dlpack-null-deleter", script, "export", event="export")
    assert f["severity"] == "error"
    assert_finding_at(res, "dlpack-null-deleter", script, "call", event="consume")
    assert_finding_at(res, "dlpack-null-deleter", script, "call", event="delete")
    assert "ERROR: capsan: dlpack-null-deleter" in res.stderr, res.stderr
    assert res.stderr.index("dlpack-null-deleter") < res.stderr.index("Segmentation fault")
    p = process_of(res.report)
    assert p["ended"] == "signal" and p["status"] == signal.SIGSEGV, p
    # a crashed process is not judged for leaks
    assert "dlpack-leak" not in kinds(res.report), res.describe()


# ---------------------------------------------------------------- bad tensor

BAD = ["ndim", "null_shape", "dtype_code", "lanes", "device", "negative_shape",
       "unreadable", "unreadable_shape", "version_major", "flags"]


@pytest.mark.parametrize("bad", BAD)
def test_bad_tensor(tmp_path, bad):
    script = S / "dl_bad_tensor.py"
    res = run_capsan(script, tmp_path, args=[bad])
    error_exit(res)
    # the capsule was still released (an unreadable struct has no deleter
    # anyone could call; capsan must not touch it either)
    assert f"deleted {0 if bad == 'unreadable' else 1}" in res.stdout, res.describe()
    tag = {"version_major": "export-major", "flags": "export-flags"}.get(bad, "export")
    assert_finding_at(res, "dlpack-bad-tensor", script, tag)
    only_kinds(res, ["dlpack-bad-tensor"])
    assert_lsan_stderr(res.stderr, "dlpack-bad-tensor")


@pytest.mark.parametrize("side", ["producer", "consumer"])
def test_bad_tensor_mutated_on_loan(tmp_path, side):
    """R20: the producer halves the shape after the export (seen at the
    consume), or the consumer writes into the shape (seen at the delete).
    One change is one finding, although the delete sees the producer's too."""
    script = S / "dl_mutated.py"
    res = run_capsan(script, tmp_path, args=[side])
    error_exit(res)
    assert ("sum 6.0" if side == "producer" else "sum 28.0") in res.stdout, res.describe()
    assert "deleted 1" in res.stdout, res.describe()
    at = "consume" if side == "producer" else "reshape"
    f = assert_finding_at(res, "dlpack-bad-tensor", script, at, event="check")
    assert_finding_at(res, "dlpack-bad-tensor", script,
                      "export" if side == "producer" else "export-c", event="export")
    assert "changed while the tensor was on loan (R20)" in f["message"], f["message"]
    assert "value" not in f["message"], f["message"]
    assert len(findings(res.report)) == 1, res.describe()
    only_kinds(res, ["dlpack-bad-tensor"])


def test_bad_tensor_kinds_match_fixture():
    """BAD covers every malformation the fixture can produce (the versioned
    ones come from the scenario's own versioned capsule)."""
    require_fixtures()
    out = subprocess.run([str(STATIC_PY), "-c", "import dlproducer; print(*dlproducer.bad_kinds())"],
                         capture_output=True, text=True, env=base_env(), timeout=60)
    assert out.returncode == 0, out.stderr
    assert set(out.stdout.split()) == set(BAD) - {"version_major", "flags"}, out.stdout


# ---------------------------------------------------------------- byte offset

@pytest.mark.parametrize("how", ["object", "capsule"])
def test_byte_offset_ignored_by_torch(tmp_path, how):
    script = S / "dl_byte_offset.py"
    res = run_capsan(script, tmp_path, args=[how])
    error_exit(res)
    # the bug is real: torch read the 16 bytes before the first element
    assert "torch saw [-1.0, -1.0, -1.0, -1.0, 0.0, 1.0, 2.0, 3.0]" in res.stdout, res.describe()
    # torch.from_dlpack is Python (torch/utils/dlpack.py): that is the innermost
    # Python frame; the script's line is further out in the same stack
    tag = "consume" if how == "object" else "consume-cap"
    f = assert_finding_at(res, "dlpack-byte-offset-ignored", script, tag, event="consume",
                          innermost=False)
    cons = [e for e in f["events"] if e["event"] == "consume"]
    assert any(fr.get("python") and fr["file"].endswith("torch/utils/dlpack.py")
               for e in cons for fr in e["stack"]), "torch's from_dlpack frame missing"
    only_kinds(res, ["dlpack-byte-offset-ignored"])
    assert_lsan_stderr(res.stderr, "dlpack-byte-offset-ignored")


def test_byte_offset_dropped_by_reexport(tmp_path, anypy):
    """A bridge that consumes a tensor with byte_offset 16 and hands the
    same buffer on starting at data: its reader sums the wrong elements
    natively; capsan says dlpack-byte-offset-ignored at the bridge's line."""
    script = S / "dl_bridge.py"
    native = run_plain(script, args=["bug"], interpreter=anypy)
    assert native.returncode == 0 and "sum 2.0" in native.stdout, (native.stdout, native.stderr)
    res = run_capsan(script, tmp_path, args=["bug"], interpreter=anypy)
    error_exit(res)
    assert "sum 2.0" in res.stdout, res.describe()
    f = assert_finding_at(res, "dlpack-byte-offset-ignored", script, "bridge", event="reexport")
    assert "re-exported" in f["message"] and "byte_offset 16" in f["message"], f["message"]
    assert_finding_at(res, "dlpack-byte-offset-ignored", script, "export", event="export")
    assert len(findings(res.report)) == 1, res.describe()
    only_kinds(res, ["dlpack-byte-offset-ignored"])
    assert_lsan_stderr(res.stderr, "dlpack-byte-offset-ignored")


def test_byte_offset_kept_by_reexport_is_clean(tmp_path, anypy):
    """The twin: the bridge starts at data + byte_offset."""
    script = S / "dl_bridge.py"
    res = run_capsan(script, tmp_path, args=["good"], interpreter=anypy)
    assert res.returncode == 0 and "sum 28.0" in res.stdout, res.describe()
    assert findings(res.report) == [], res.describe()


def test_byte_offset_ignored_by_a_python_consumer(tmp_path, anypy):
    """A consumer written in Python (through ctypes, as warp's is) whose
    array starts at data: it sums the wrong elements natively; capsan reads
    the array's __array_interface__ at the rename and says
    dlpack-byte-offset-ignored at the consume."""
    script = S / "dl_py_consumer.py"
    native = run_plain(script, args=["bug"], interpreter=anypy)
    assert native.returncode == 0 and "sum 2.0" in native.stdout, (native.stdout, native.stderr)
    res = run_capsan(script, tmp_path, args=["bug"], interpreter=anypy)
    error_exit(res)
    assert "sum 2.0" in res.stdout, res.describe()
    f = assert_finding_at(res, "dlpack-byte-offset-ignored", script, "consume", event="consume",
                          innermost=False)
    assert "__array_interface__" in f["message"] and "byte_offset 16" in f["message"], f["message"]
    assert len(findings(res.report)) == 1, res.describe()
    only_kinds(res, ["dlpack-byte-offset-ignored"])


def test_byte_offset_honored_by_a_python_consumer_is_clean(tmp_path, anypy):
    """The twin: the consumer's array starts at data + byte_offset."""
    script = S / "dl_py_consumer.py"
    res = run_capsan(script, tmp_path, args=["good"], interpreter=anypy)
    assert res.returncode == 0 and "sum 28.0" in res.stdout, res.describe()
    assert findings(res.report) == [], res.describe()


def test_torch2_reexport_of_offset_tensor_is_clean(tmp_path):
    """torch 2.13 honors byte_offset: its to_dlpack of the imported tensor
    starts at the first element."""
    script = S / "dl_reexport_clean.py"
    res = run_capsan(script, tmp_path, interpreter=current_python("cp311"))
    assert res.returncode == 0 and "torch 28.0" in res.stdout, res.describe()
    assert findings(res.report) == [], res.describe()


# ---------------------------------------------------------------- SIGKILL

def test_sigkilled_trace_still_replays(tmp_path):
    """A double delete (protect=1), then SIGKILL: the shared-mmap trace survives."""
    require_runtime()
    script = S / "dl_killed.py"
    env = base_env({"LD_PRELOAD": str(LIBCAPSAN),
                    "CAPSAN_OPTIONS": f"log_path={tmp_path / 't'}:protect=1"})
    proc = subprocess.Popen([str(STATIC_PY), str(script)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, env=env, text=True)
    try:
        line = proc.stdout.readline()
        assert line.strip() == "ready", (line, proc.poll())
        time.sleep(0.2)
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == -signal.SIGKILL
    traces = trace_files(tmp_path)
    assert len(traces) == 1, traces
    _, rep = capsan_report(traces)
    p = process_of(rep)
    assert p["ended"] == "unknown", p
    assert p["pid"] == proc.pid
    fs = findings(rep, "dlpack-double-delete")
    assert fs, rep
    line = marker_line(script, "delete")
    assert any(e["event"] == "delete" and any(fr.get("python") and fr.get("line") == line
                                              and fr["file"].endswith("dl_killed.py")
                                              for fr in e["stack"])
               for e in fs[0]["events"]), fs[0]
    # nothing is judged a leak in a process that did not reach its exit
    assert "dlpack-leak" not in kinds(rep)
    # the text renderer copes with the truncated trace too
    cp, _ = capsan_report(traces, fmt="text")
    assert cp.returncode in (0, DEFAULT_EXITCODE), cp.stderr
    assert "dlpack-double-delete" in cp.stdout + cp.stderr


# ---------------------------------------------------------------- options

def test_halt_on_error_stops_at_first(tmp_path):
    script = S / "dl_halt.py"
    res = run_capsan(script, tmp_path, options=["halt_on_error=1"])
    error_exit(res)
    assert "after first" not in res.stdout, "the process went on after the first error\n" + res.describe()
    assert_finding_at(res, "dlpack-reconsume", script, "first")
    errs = findings(res.report, severity="error")
    assert len(errs) == 1, res.describe()
    assert "dlpack-reconsume" in res.stderr
    p = process_of(res.report)
    assert p["ended"] == "exit" and p["status"] == DEFAULT_EXITCODE, p


def test_without_halt_both_errors_reported(tmp_path):
    script = S / "dl_halt.py"
    res = run_capsan(script, tmp_path)
    error_exit(res)
    assert "after second" in res.stdout
    assert_finding_at(res, "dlpack-reconsume", script, "first")
    assert_finding_at(res, "dlpack-leak", script, "second", event="consume")


def test_halt_on_error_with_custom_exitcode(tmp_path):
    res = run_capsan(S / "dl_halt.py", tmp_path, options=["halt_on_error=1", "exitcode=42"])
    assert res.returncode == 42, res.describe()
    assert "after first" not in res.stdout


@pytest.mark.parametrize("mode", ["run", "preload"])
def test_exitcode_zero_keeps_program_status(tmp_path, mode):
    script = S / "dl_leak.py"
    res = run_capsan(script, tmp_path / "a", options=["exitcode=0"], mode=mode, args=["consumed", "3"])
    assert res.returncode == 3, res.describe()
    assert kinds(res.report) == {"dlpack-leak"}
    res = run_capsan(script, tmp_path / "b", options=["exitcode=0"], mode=mode, args=["consumed"])
    assert res.returncode == 0, res.describe()
    assert "dlpack-leak" in res.stderr
    # the default replaces the program's own status when there are errors
    res = run_capsan(script, tmp_path / "c", mode=mode, args=["consumed", "3"])
    assert res.returncode == DEFAULT_EXITCODE, res.describe()


def test_custom_exitcode(tmp_path):
    res = run_capsan(S / "dl_reconsume.py", tmp_path, options=["exitcode=7"])
    assert res.returncode == 7, res.describe()


def test_report_none_is_silent_but_traced(tmp_path):
    res = run_capsan(S / "dl_reconsume.py", tmp_path, options=["report=none"])
    error_exit(res)
    assert "ERROR: capsan:" not in res.stderr, res.stderr
    assert kinds(res.report) == {"dlpack-reconsume"}


def test_unknown_option_key_is_named_and_program_runs(tmp_path):
    """Expected behaviour (LeakSanitizer's, and 'capsan must never be the reason a
    program fails'): an unknown CAPSAN_OPTIONS key is reported on stderr by name,
    and the program still runs with the other options in force."""
    res = run_capsan(S / "opt_probe.py", tmp_path, mode="preload",
                     options=["no_such_capsan_option=1"])
    assert "no_such_capsan_option" in res.stderr, res.describe()
    assert "program ran 6.0" in res.stdout, res.describe()
    assert res.returncode == 0, res.describe()


def test_unknown_option_via_capsan_run(tmp_path):
    """Through `capsan run`, an unknown key is named on stderr too (run may refuse
    or proceed; either way the user must be told which key)."""
    res = run_capsan(S / "opt_probe.py", tmp_path, options=["bogus_key_xyz=1"])
    assert "bogus_key_xyz" in res.stderr, res.describe()
    if "program ran" not in res.stdout:
        assert res.returncode != 0, "refused silently with status 0\n" + res.describe()


def test_help_lists_every_option(tmp_path):
    require_runtime()
    env = base_env({"LD_PRELOAD": str(LIBCAPSAN), "CAPSAN_OPTIONS": "help=1"})
    cp = subprocess.run([str(STATIC_PY), str(S / "opt_probe.py")], capture_output=True,
                        text=True, env=env, timeout=60)
    out = cp.stdout + cp.stderr
    for name in contract_options():
        assert name in out, f"help=1 does not list {name}:\n{out}"
    assert "23" in out, "help=1 should show defaults (exitcode 23)"
    # options.inc: "print this list of options and exit"
    assert "program ran" not in cp.stdout, "help=1 should exit before the program runs"
    assert cp.returncode == 0, cp.returncode


def test_capsan_cli_knows_run_and_report():
    require_runtime()
    cp = subprocess.run([str(CAPSAN), "--help"], capture_output=True, text=True, timeout=30)
    out = cp.stdout + cp.stderr
    assert "run" in out and "report" in out, out
    cp = subprocess.run([str(CAPSAN), "no-such-subcommand"], capture_output=True, text=True,
                        timeout=30)
    assert cp.returncode != 0


def test_stack_depth_options(tmp_path):
    """python_depth=0 drops the Python frames, native_depth=0 the native ones."""
    script = S / "dl_reconsume.py"
    res = run_capsan(script, tmp_path / "full", options=[])
    evs = [ev for f in findings(res.report) for ev in f["events"]]
    assert any(fr["python"] for ev in evs for fr in ev["stack"]), res.describe()
    assert any(not fr["python"] for ev in evs for fr in ev["stack"]), (
        "no native frames recorded at the default native_depth=16\n" + res.describe())
    res = run_capsan(script, tmp_path / "nopy", options=["python_depth=0"])
    assert kinds(res.report) == {"dlpack-reconsume"}
    evs = [ev for f in findings(res.report) for ev in f["events"]]
    assert evs and not any(fr["python"] for ev in evs for fr in ev["stack"]), res.describe()
    res = run_capsan(script, tmp_path / "nonat", options=["native_depth=0"])
    assert kinds(res.report) == {"dlpack-reconsume"}
    evs = [ev for f in findings(res.report) for ev in f["events"]]
    assert evs and not any(not fr["python"] for ev in evs for fr in ev["stack"]), res.describe()
    assert_finding_at(res, "dlpack-reconsume", script, "reconsume")


def test_suppression_file_in_report(tmp_path):
    """`capsan report --suppressions FILE`: LeakSanitizer syntax KIND:pattern, matched
    against the event stacks (here the scenario's file name); `leak:` matches every
    leak kind; a rule for another kind hides nothing."""
    res = run_capsan(S / "dl_leak.py", tmp_path / "r", args=["consumed"])
    assert kinds(res.report) == {"dlpack-leak"}
    supp = tmp_path / "supp.txt"
    supp.write_text("# capsan suppressions\nleak:dl_leak.py\n")
    _, rep = capsan_report(res.traces, extra_args=["--suppressions", supp])
    assert findings(rep) == [], findings(rep)
    supp.write_text("dlpack-double-delete:dl_leak.py\n")
    _, rep = capsan_report(res.traces, extra_args=["--suppressions", supp])
    assert kinds(rep) == {"dlpack-leak"}


def test_suppression_option_in_runtime(tmp_path):
    """CAPSAN_OPTIONS=suppressions=FILE: the live report and the exit status
    honour the same rules (options.inc: suppressions)."""
    supp = tmp_path / "supp.txt"
    supp.write_text("leak:dl_leak.py\n")
    res = run_capsan(S / "dl_leak.py", tmp_path / "s", options=[f"suppressions={supp}"],
                     args=["consumed"])
    assert res.returncode == 0, "a suppressed leak is no error\n" + res.describe()
    assert "ERROR: capsan:" not in res.stderr
    supp.write_text("dlpack-double-delete:dl_leak.py\n")
    res = run_capsan(S / "dl_leak.py", tmp_path / "t", options=[f"suppressions={supp}"],
                     args=["consumed"])
    error_exit(res)
    assert "dlpack-leak" in res.stderr


def test_report_json_option_writes_pid_json(tmp_path):
    """report=json writes log_path.PID.json (the same schema as `capsan report`)
    instead of the text report on stderr."""
    res = run_capsan(S / "dl_reconsume.py", tmp_path, options=["report=json"])
    error_exit(res)
    assert "ERROR: capsan:" not in res.stderr, res.stderr
    assert len(res.traces) == 1
    js = tmp_path / (res.traces[0].name + ".json")
    assert js.exists(), sorted(p.name for p in tmp_path.iterdir())
    rep = json.loads(js.read_text())
    check_schema(rep)
    assert kinds(rep) == {"dlpack-reconsume"}
    assert_finding_at(Result(res.returncode, "", "", rep), "dlpack-reconsume",
                      S / "dl_reconsume.py", "reconsume")


def test_text_report_names_the_python_line(tmp_path):
    script = S / "dl_double_delete.py"
    res = run_capsan(script, tmp_path, options=["protect=1"], args=["legacy"])
    cp, _ = capsan_report(res.traces, fmt="text")
    line = marker_line(script, "delete")
    assert f"dl_double_delete.py:{line}" in cp.stdout, cp.stdout
    assert "ERROR: capsan: dlpack-double-delete" in cp.stdout
    assert "SUMMARY: capsan:" in cp.stdout
    # and so does the live report on stderr
    assert f"dl_double_delete.py:{line}" in res.stderr


@pytest.mark.parametrize("name,args,opts", [
    ("dl_double_delete.py", ["legacy"], ["protect=1"]),
    ("dl_unchecked.py", ["consume_leak"], []),
    ("dl_not_renamed.py", [], ["protect=1"]),
    ("dl_leak.py", ["no_destructor"], []),
    ("dl_halt.py", [], []),
])
def test_full_trace_replay_matches_live_findings(tmp_path, name, args, opts):
    """With record_all=1 the offline replay judges every event again; it must
    reach the same findings as the live runtime (one lifecycle module, two users)."""
    if "record_all" not in contract_options():
        pytest.skip("options.inc has no record_all option")
    live = run_capsan(S / name, tmp_path / "live", options=opts, args=args)
    full = run_capsan(S / name, tmp_path / "full", options=opts + ["record_all=1"], args=args)
    assert live.returncode == full.returncode == DEFAULT_EXITCODE, live.describe() + full.describe()

    def sig(r):
        return sorted((f["kind"], tuple(e["event"] for e in f["events"])) for f in findings(r.report))
    assert sig(live) == sig(full), (sig(live), sig(full))
    assert sig(live)


def test_halt_on_error_stops_before_the_double_free(tmp_path):
    """Without protect, halt_on_error=1 reports the second deleter call and stops
    the process before executing it: exit status 23, not SIGABRT."""
    script = S / "dl_double_delete.py"
    res = run_capsan(script, tmp_path, options=["halt_on_error=1"], args=["legacy"])
    error_exit(res)
    assert "survived" not in res.stdout
    assert "double free" not in res.stderr, "the double free ran\n" + res.describe()
    assert_finding_at(res, "dlpack-double-delete", script, "delete", event="delete")
    p = process_of(res.report)
    assert p["ended"] == "exit" and p["status"] == DEFAULT_EXITCODE, p


# ---------------------------------------------------------------- devices

def test_device_mismatch(tmp_path):
    """Memory from a handler for pinned host memory, exported as plain CPU."""
    script = S / "dl_device_mismatch.py"
    res = run_capsan(script, tmp_path)
    assert res.returncode == 0, "a warning keeps the exit status\n" + res.describe()
    assert "sum 28.0" in res.stdout
    f = assert_finding_at(res, "dlpack-device-mismatch", script, "export", event="export",
                          innermost=False)
    # the second event is where the pinned memory was allocated
    assert events_at(f, script, marker_line(script, "alloc"), "alloc"), f
    assert kinds(res.report) == {"dlpack-device-mismatch"}


# ------------------------------------------- double deletes a protocol error causes

def assert_before_crash(res, kind):
    """The finding is on stderr before whatever the bug did next."""
    assert f"ERROR: capsan: {kind}" in res.stderr, res.describe()
    at = res.stderr.index(f"ERROR: capsan: {kind}")
    for crash in ("Segmentation fault at", "Aborted at"):
        if crash in res.stderr:
            assert at < res.stderr.index(crash), res.stderr


def test_ctypes_consumer_that_never_renames(tmp_path, anypy):
    """numpy's destructor deletes again after a ctypes consumer released
    without renaming: reported before numpy's destructor runs (it reads the
    deleter out of freed memory, so capsan's trampoline may never see that
    call), with both deletes at their Python lines; the consumer's release
    line comes from a ctypes call made without the GIL. protect=1 skips the
    destructor. (Unprotected, numpy's destructor reads freed memory: what
    follows is undefined, so only the unchecked-destructor test below runs
    a double delete for real.)"""
    script = S / "dl_ctypes_release.py"
    res = run_capsan(script, tmp_path, interpreter=anypy, options=["protect=1"])
    assert res.returncode == DEFAULT_EXITCODE, res.describe()
    assert "total 6.0" in res.stdout and "survived" in res.stdout, res.describe()
    assert_finding_at(res, "dlpack-not-renamed", script, "release", event="delete")
    f = assert_finding_at(res, "dlpack-not-renamed", script, "drop", event="delete")
    assert [e["event"] for e in f["events"]].count("delete") == 2, f["events"]
    assert_finding_at(res, "dlpack-not-renamed", script, "export", event="export")
    only_kinds(res, ["dlpack-not-renamed"])


def test_double_delete_after_unchecked_destructor(tmp_path, anypy):
    """np.from_dlpack keeps a tensor whose producer's destructor released it
    anyway; the array's death deletes it again: dlpack-double-delete naming
    its cause, reported before numpy's call runs (glibc aborts natively)."""
    script = S / "dl_unchecked_numpy.py"
    res = run_capsan(script, tmp_path, interpreter=anypy)
    assert_before_crash(res, "dlpack-double-delete")
    f = assert_finding_at(res, "dlpack-double-delete", script, "drop", event="delete")
    assert f["cause"] == "dlpack-unchecked-destructor", f
    assert "dlpack-unchecked-destructor" in f["message"]
    deletes = [e for e in f["events"] if e["event"] == "delete"]
    assert len(deletes) == 2, f["events"]
    assert_finding_at(res, "dlpack-double-delete", script, "import", event="delete")
    assert_finding_at(res, "dlpack-unchecked-destructor", script, "import", event="delete")
    # protect=1 skips the destructor's release: the array's own is then the only one
    safe = run_capsan(script, tmp_path / "safe", interpreter=anypy, options=["protect=1"])
    assert safe.returncode == DEFAULT_EXITCODE and "survived" in safe.stdout, safe.describe()
    only_kinds(safe, ["dlpack-unchecked-destructor"])


# ---------------------------------------------------------------- consumed names across versions (R8)

def test_consumer_renames_versioned_capsule_old_name(tmp_path, anypy):
    """A 0.x consumer renames a versioned capsule "used_dltensor": its own
    fault (dlpack-bad-tensor at the rename), not the producer's, whose
    destructor rightly took the capsule for unconsumed; the consumer's
    release is then the second (protect=1 skips it)."""
    script = S / "dl_rename_versions.py"
    res = run_capsan(script, tmp_path, interpreter=anypy, args=["consumer"],
                     options=["protect=1"])
    error_exit(res)
    assert "ok 1" in res.stdout, res.describe()
    f = assert_finding_at(res, "dlpack-bad-tensor", script, "old-name", innermost=False)
    assert "other DLPack version's consumed name" in f["message"], f["message"]
    d = assert_finding_at(res, "dlpack-double-delete", script, "second-release", event="delete",
                          innermost=False)
    assert "dlpack-bad-tensor" in d["message"], d["message"]
    only_kinds(res, ["dlpack-bad-tensor", "dlpack-double-delete"])


def test_producer_knows_only_old_consumed_name(tmp_path, anypy):
    """A consumer renames correctly (used_dltensor_versioned); the producer's
    destructor knows only used_dltensor and releases the tensor again: the
    producer's fault (dlpack-unchecked-destructor)."""
    script = S / "dl_rename_versions.py"
    res = run_capsan(script, tmp_path, interpreter=anypy, args=["producer"],
                     options=["protect=1"])
    error_exit(res)
    assert "ok 1" in res.stdout, res.describe()
    assert_finding_at(res, "dlpack-unchecked-destructor", script, "producer-deletes",
                      innermost=False)
    only_kinds(res, ["dlpack-unchecked-destructor"])


# ---------------------------------------------------------------- the error indicator (R5)

def test_destructor_clears_pending_error(tmp_path, anypy):
    """A destructor that clears the error indicator turns the consumer's
    TypeError into SystemError (natively too); capsan names the call."""
    script = S / "dl_error_clobbered.py"
    plain = run_plain(script, interpreter=anypy)
    assert plain.stdout.strip() == "SystemError", plain.stdout + plain.stderr
    res = run_capsan(script, tmp_path, interpreter=anypy)
    error_exit(res)
    assert "SystemError" in res.stdout, res.describe()
    f = assert_finding_at(res, "dlpack-error-clobbered", script, "refused", event="error-state",
                          innermost=False)
    assert "cleared a pending exception" in f["message"], f["message"]
    only_kinds(res, ["dlpack-error-clobbered"])


def test_destructor_leaving_error_alone_is_clean(tmp_path, anypy):
    script = S / "dl_error_clobbered.py"
    res = run_capsan(script, tmp_path, interpreter=anypy, args=["good"])
    assert res.returncode == 0 and "TypeError" in res.stdout, res.describe()
    assert findings(res.report) == [], res.describe()
