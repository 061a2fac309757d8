"""Correct DLPack traffic must produce ZERO findings: real numpy 1.24 and
torch 1.13 exchanges (every dtype both accept, 0-d, empty, non-contiguous,
threads, fork), the correct fixture paths (legacy and versioned), and capsan
must not change what the program prints.

Every clean test also checks that capsan really saw the traffic (the trace
has events), so "no findings" is never the result of seeing nothing.
"""
import re

import pytest

from conftest import (BUILD, FIXDIR, SCENARIOS, contract_options, events_at, findings, kinds, marker_line,
                      process_of, run_capsan, run_plain, summarize)

S = SCENARIOS


def assert_clean(res, min_events=1, nprocs=1):
    assert res.returncode == 0, res.describe()
    assert res.report is not None, "no trace file was written\n" + res.describe()
    assert findings(res.report) == [], "findings in a clean program\n" + res.describe()
    assert "ERROR: capsan:" not in res.stderr and "WARNING: capsan:" not in res.stderr, res.stderr
    procs = res.report["processes"]
    assert len(procs) == nprocs, summarize(res.report)
    for p in procs:
        assert p["ended"] == "exit" and p["status"] == 0, p
        assert p["summary"]["errors"] == 0 and p["summary"]["warnings"] == 0, p["summary"]
        assert p["summary"]["leaked_bytes"] == 0, p["summary"]
        assert p["summary"]["events"] >= min_events, (
            f"capsan saw {p['summary']['events']} events, expected >= {min_events}: "
            f"are the hooks live?\n{res.describe()}")


# ---------------------------------------------------------------- numpy <-> torch

def test_roundtrip_clean(tmp_path, interp):
    res = run_capsan(S / "clean_roundtrip.py", tmp_path, interpreter=interp)
    # 7 numpy cases x 2 exchanges + 5 torch cases x 2 + 1 explicit capsule = 25
    # exports, each exported, consumed and deleted at least
    assert_clean(res, min_events=25 * 3)
    assert res.stdout.rstrip().endswith("done"), res.describe()
    for name in ("zero_d", "empty", "empty_2d", "transposed", "step_slice"):
        assert f"np->torch->np {name}:" in res.stdout


def test_roundtrip_clean_bare_preload(tmp_path):
    res = run_capsan(S / "clean_roundtrip.py", tmp_path, mode="preload")
    assert_clean(res, min_events=25 * 3)


def test_stdout_identical_with_and_without_capsan(tmp_path, interp):
    script = S / "clean_roundtrip.py"
    native = run_plain(script, interpreter=interp)
    assert native.returncode == 0, native.stderr
    res = run_capsan(script, tmp_path, interpreter=interp)
    assert res.returncode == 0, res.describe()
    assert res.stdout.encode() == native.stdout.encode(), (
        f"stdout differs under capsan\n--- native ---\n{native.stdout}\n--- capsan ---\n{res.stdout}")


# Which dtypes each direction accepts (numpy 1.24.2 / torch 1.13.1, verified):
BOTH = ["int8", "int16", "int32", "int64", "uint8", "float16", "float32", "float64",
        "complex64", "complex128"]
# Pairs one side refuses; they are not skipped but checked: the library raises,
# and the refusal path (capsule left unconsumed, released by its producer) is clean.
REFUSED = {
    ("uint16", "np->torch"): "RuntimeError",     # torch: "Unsupported kUInt bits 16"
    ("uint32", "np->torch"): "RuntimeError",
    ("uint64", "np->torch"): "RuntimeError",
    ("bool", "np->torch"): "BufferError",        # numpy 1.24 cannot export bool
    ("uint16", "torch->np"): "NoTorchDtype",     # torch 1.13 has no uint16/32/64 tensors
    ("uint32", "torch->np"): "NoTorchDtype",
    ("uint64", "torch->np"): "NoTorchDtype",
    ("bool", "torch->np"): "RuntimeError",       # torch: "Bool type is not supported by dlpack"
    ("bfloat16", "torch->np"): "RuntimeError",   # numpy: "Unsupported dtype in DLTensor"
}


def test_every_dtype_clean(tmp_path):
    """Every dtype round trip is clean; the only findings are torch 1.13's own
    leaks on two refusal paths (see the scenario's docstring), reported as
    numpy-leak at the line that handed torch the array."""
    script = S / "clean_dtypes.py"
    res = run_capsan(script, tmp_path)
    rep = res.report
    line = marker_line(script, "from_numpy")
    leaks = findings(rep, "numpy-leak")
    assert kinds(rep) == {"numpy-leak"}, summarize(rep)
    # uint16, uint32, uint64 (from_numpy TypeError) and bool (to_dlpack refusal): 6 elements each
    assert sorted(f["bytes"] for f in leaks) == [6, 12, 24, 48], summarize(rep)
    for f in leaks:
        assert events_at(f, script, line, "alloc"), summarize(rep)
    assert process_of(rep)["summary"]["events"] >= 20 * 3
    got = {}
    for line in res.stdout.splitlines():
        m = re.fullmatch(r"(OK|REFUSED) (\w+) (\S+)(?: (\w+))?", line)
        if m:
            got[(m.group(2), m.group(3))] = m.group(4) if m.group(1) == "REFUSED" else "OK"
    for d in BOTH:
        for direction in ("np->torch", "torch->np"):
            assert got.get((d, direction)) == "OK", (d, direction, got.get((d, direction)))
    for pair, exc in REFUSED.items():
        assert got.get(pair) == exc, (pair, got.get(pair), exc)
    assert len(got) == 2 * len(BOTH) + len(REFUSED), sorted(set(got) - {
        (d, x) for d in BOTH for x in ("np->torch", "torch->np")} - set(REFUSED))


# ---------------------------------------------------------------- concurrency

def test_threads_clean(tmp_path, interp):
    n = 2000
    res = run_capsan(S / "clean_threads.py", tmp_path, interpreter=interp, args=[n], timeout=150)
    # per exchange: two exports (numpy's, torch's), each consumed and deleted
    assert_clean(res, min_events=4 * n * 2 * 3)
    assert f"threads done {4 * n}" in res.stdout
    p = process_of(res.report)
    assert p["summary"]["events"] >= 4 * n * 6


def test_fork_child_has_its_own_clean_trace(tmp_path, interp):
    res = run_capsan(S / "clean_fork.py", tmp_path, interpreter=interp)
    assert_clean(res, min_events=50 * 3, nprocs=2)
    assert len(res.traces) == 2, res.traces
    m = re.search(r"child status 0 child pid (\d+)", res.stdout)
    assert m, res.stdout
    child_pid = int(m.group(1))
    child = process_of(res.report, child_pid)
    parent = [p for p in res.report["processes"] if p["pid"] != child_pid][0]
    assert child["ppid"] == parent["pid"], (child, parent)
    assert child["summary"]["events"] >= 200 * 3
    assert parent["summary"]["events"] >= 250 * 3
    # each trace file holds only its own process
    assert {int(t.name.split(".")[-1]) for t in res.traces} == {child_pid, parent["pid"]}


# ---------------------------------------------------------------- fixtures

def test_fixture_good_paths_clean(tmp_path, interp):
    res = run_capsan(S / "clean_fixtures.py", tmp_path, interpreter=interp)
    # 13 fixture exports + numpy's and torch's capsules consumed by the fixture
    assert_clean(res, min_events=15 * 2)
    assert "fixtures ok 13" in res.stdout


def test_versioned_good_path_clean(tmp_path):
    code = (
        "import dlconsumer as C, dlproducer as P\n"
        "for i in range(50):\n"
        "    assert C.consume_versioned_good(P.versioned(16, minor=i % 3)) == 120.0\n"
        "c = P.versioned(4)\n"
        "del c\n"
        "assert P.deleted_count() == 51\n"
        "print('ok')\n")
    res = run_capsan(code, tmp_path)
    assert_clean(res, min_events=51 * 2)
    assert res.stdout == "ok\n"


def test_many_short_lived_exports_clean(tmp_path):
    """More struct addresses than any per-stripe tombstone FIFO: malloc reuses
    addresses of released structs; reuse must never look like a bug."""
    code = (
        "import dlconsumer as C, dlproducer as P\n"
        "for i in range(20000):\n"
        "    C.consume_good(P.good(4))\n"
        "    c = P.good(2); del c\n"
        "assert P.deleted_count() == 40000\n"
        "print('ok')\n")
    res = run_capsan(code, tmp_path)
    assert_clean(res, min_events=40000 * 2)



def test_views_alive_at_exit_are_not_leaks(tmp_path, interp):
    """Tensors kept in globals (and in a reference cycle) until the end are
    released during finalization: no dlpack-leak."""
    res = run_capsan(S / "clean_alive_at_exit.py", tmp_path, interpreter=interp)
    assert_clean(res, min_events=6 * 2)
    assert "exiting with live views 45.0 45" in res.stdout


def test_clean_program_keeps_its_exit_status(tmp_path, interp):
    code = ("import sys, dlconsumer as C, dlproducer as P\n"
            "C.consume_good(P.good(4))\n"
            "sys.exit(5)\n")
    res = run_capsan(code, tmp_path / "a", interpreter=interp)
    assert res.returncode == 5, res.describe()
    assert_seen_clean(res, status=5)
    code = ("import dlconsumer as C, dlproducer as P\n"
            "C.consume_good(P.good(4))\n"
            "raise SystemError('boom')\n")
    res = run_capsan(code, tmp_path / "b", interpreter=interp)
    assert res.returncode == 1, res.describe()
    assert "SystemError: boom" in res.stderr
    assert_seen_clean(res, status=1)


def assert_seen_clean(res, status):
    """No finding, and capsan did see the exchange (export, consume, delete)."""
    assert res.report is not None, "no trace file was written\n" + res.describe()
    assert findings(res.report) == [], res.describe()
    p = process_of(res.report)
    assert p["ended"] == "exit" and p["status"] == status, p
    assert p["summary"]["events"] >= 3, res.describe()


def _need_record_all():
    if "record_all" not in contract_options():
        pytest.skip("options.inc has no record_all option: full-trace replay not available")


@pytest.mark.parametrize("script,args", [("clean_threads.py", ["1000"]), ("clean_roundtrip.py", []),
                                         ("clean_fixtures.py", []), ("clean_fork.py", [])])
def test_full_trace_replays_clean(tmp_path, script, args):
    """record_all=1 writes every event; the offline replay of the whole stream
    (events of 4 threads interleaved, forks) must judge it as clean as the live run."""
    _need_record_all()
    res = run_capsan(S / script, tmp_path, options=["record_all=1"], args=args)
    nprocs = 2 if script == "clean_fork.py" else 1
    assert_clean(res, min_events=10, nprocs=nprocs)


def test_more_destructors_than_stubs_clean(tmp_path):
    """Capsan forwards each capsule's death through a stub per distinct
    destructor; past its 64 stubs, capsules keep their own destructor. Both
    kinds must release every tensor once and report nothing."""
    env = {"PYTHONPATH": f"{BUILD / 'python'}:{FIXDIR}"}
    res = run_capsan(S / "clean_many_destructors.py", tmp_path, mode="preload", env=env)
    assert_clean(res, min_events=64 * 2)
    assert "destructors ok 70" in res.stdout, res.describe()


@pytest.mark.parametrize("tag,versioned", [("static", False), ("shared", False),
                                           ("cp311", False), ("cp311", True)])
def test_release_inside_a_capsule_made_where_a_dead_one_lay(tmp_path, tag, versioned):
    """A tensor released inside another capsule's destructor (torch's
    storage dying inside numpy's owner capsule's) is its consumer's release,
    even when that capsule lies where the tensor's consumed export lay:
    no dlpack-unchecked-destructor. The scenario makes the addresses meet."""
    from conftest import ALL_PYTHONS, CURRENT, current_python
    if tag in ("cp311",) and tag not in CURRENT:
        pytest.skip("no cp311 venv (make venvs)")
    py = current_python(tag) if tag in CURRENT else ALL_PYTHONS[tag]
    script = SCENARIOS / "dl_reused_capsule.py"
    res = run_capsan(script, tmp_path, interpreter=py, args=["versioned"] if versioned else [])
    assert "done" in res.stdout, res.describe()
    assert "owner capsule where the first lay: True" in res.stdout, res.stdout
    assert res.returncode == 0, res.describe()
    assert findings(res.report) == [], res.describe()
