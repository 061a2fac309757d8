"""DLPack 1.3's C exchange API (rulebook-seams R50-R56, issue 18): tensors
that cross through a type's __dlpack_c_exchange_api__ table, with no
capsule. Real peers: torch 2.13's table and apache-tvm-ffi, in the cp311
venv. Fixtures: xkernel.c (kernels using torch's table, one bug each) and
xproducer.c (a producer's table with the bugs producers ship)."""
import os
import subprocess

import pytest

from conftest import (BUILD, SCENARIOS, assert_finding_at, current_python, findings, kinds,
                      fixdir_for, is_signal, marker_line, run_capsan, run_plain, summarize)

XK = SCENARIOS / "xk_kernels.py"
XP = SCENARIOS / "xp_producers.py"
CLEAN = SCENARIOS / "xapi_clean.py"
ECHO = SCENARIOS / "xapi_echo_loop.py"
KERNEL_BUILD = {"CAPSAN_XAPI_BUILD": str(BUILD / "tests" / "xapi-kernels")}


@pytest.fixture(scope="module")
def py311():
    py = current_python("cp311")
    ok = subprocess.run([str(py), "-c", "import torch, tvm_ffi; "
                         "assert torch.__version__.startswith('2.13.0')"],
                        capture_output=True, text=True)
    if ok.returncode != 0:
        pytest.fail(f"the cp311 venv lacks torch 2.13.0 or apache-tvm-ffi (.ci/venvs): "
                    f"{ok.stderr[-2000:]}")
    return py


def events_seen(res) -> int:
    return sum(p["summary"]["events"] for p in res.report["processes"])


def event_names(f) -> list:
    return [e["event"] for e in f["events"]]


# ---- clean: real libraries in every direction ----

def test_tvm_ffi_clean_and_seen(tmp_path, py311):
    """tvm_ffi.from_dlpack, echo/nop/apply calls, a load_inline kernel whose
    output comes from torch's allocator, torch.from_dlpack of results, and
    threads: nothing to report, and capsan saw every tensor (no capsule is
    made on these paths, so the events are the table's)."""
    n = 100
    res = run_capsan(CLEAN, tmp_path, args=["all", n], interpreter=py311, env=KERNEL_BUILD,
                     timeout=300)
    assert res.returncode == 0 and res.stdout.strip() == "ok", res.describe()
    assert findings(res.report) == [], summarize(res.report)
    # echo alone is n x (from_py, to_py, two deletes)
    assert events_seen(res) >= 4 * n, res.report["processes"][0]["summary"]


def test_echo_loop_counts(tmp_path, py311):
    """1,000 echo calls: each is one from_py birth, one to_py hand-over and
    two deletes, and nothing is left at exit."""
    res = run_capsan(ECHO, tmp_path, args=[1000], interpreter=py311, options=["record_all=1"])
    assert res.returncode == 0, res.describe()
    assert findings(res.report) == [], summarize(res.report)
    assert events_seen(res) >= 4000, res.report["processes"][0]["summary"]


def test_kernels_clean(tmp_path, py311):
    """xkernel's clean kernels on torch tensors, from four threads: scale
    (from_py, allocator, to_py), total, view_total, a held tensor."""
    res = run_capsan(XK, tmp_path, args=["clean", 20], interpreter=py311)
    assert res.returncode == 0 and "ok" in res.stdout, res.describe()
    assert findings(res.report) == [], summarize(res.report)
    assert events_seen(res) >= 4 * 20 * 4, res.report["processes"][0]["summary"]


def test_producer_clean_read_only_table(tmp_path, py311):
    """xproducer's table is `static const`: capsan answers with a forwarding
    copy, and the tensors of its allocator and to_py are followed."""
    res = run_capsan(XP, tmp_path, args=["clean"], interpreter=py311)
    assert res.returncode == 0 and "ok" in res.stdout, res.describe()
    assert findings(res.report) == [], summarize(res.report)
    assert events_seen(res) >= 9, res.report["processes"][0]["summary"]


def test_views_end_with_their_call(tmp_path, py311):
    """A view's tensor freed after the call that viewed it returned: legal."""
    res = run_capsan(XK, tmp_path, args=["view_clean", 20], interpreter=py311)
    assert res.returncode == 0, res.describe()
    assert findings(res.report) == [], summarize(res.report)


# ---- each finding kind, committed by a kernel or a producer ----

def test_xapi_leak(tmp_path, py311):
    """from_py's tensor never deleted: dlpack-leak at the kernel call, born
    exchange-from-py."""
    res = run_capsan(XK, tmp_path, args=["leak"], interpreter=py311)
    assert res.returncode == 23, res.describe()
    leaks = findings(res.report, "dlpack-leak")
    assert len(leaks) == 3, summarize(res.report)
    f = assert_finding_at(res, "dlpack-leak", XK, "leak", event="exchange-from-py")
    assert "managed_tensor_from_py_object_no_sync" in f["message"], f["message"]
    assert f["object"]["type"] == "DLManagedTensorVersioned"
    assert kinds(res.report) == {"dlpack-leak"}, summarize(res.report)
    assert "taken from its Python object" in res.stderr, res.stderr[-3000:]


def test_xapi_double_delete_protect(tmp_path, py311):
    """A kernel deletes the output it handed to to_py; torch deletes it
    again when the result dies: reported before that call runs, and with
    protect=1 the call is skipped and the program ends normally."""
    res = run_capsan(XK, tmp_path, args=["double_delete"], interpreter=py311,
                     options=["protect=1"])
    assert res.returncode == 23 and "ok" in res.stdout, res.describe()
    f = assert_finding_at(res, "dlpack-double-delete", XK, "dropped", event="delete",
                          innermost=False)
    names = event_names(f)
    assert names[0] == "exchange-alloc" and "exchange-to-py" in names, names
    assert names.count("delete") == 2, names
    assert kinds(res.report) == {"dlpack-double-delete"}, summarize(res.report)


def test_xapi_double_delete_reported_before_the_crash(tmp_path, py311):
    res = run_capsan(XK, tmp_path, args=["double_delete"], interpreter=py311)
    assert res.returncode != 0, res.describe()
    assert "dlpack-double-delete" in res.stderr, res.stderr[-3000:]
    assert findings(res.report, "dlpack-double-delete"), summarize(res.report)


def test_xapi_contract_no_gil(tmp_path, py311):
    res = run_capsan(XK, tmp_path, args=["nogil"], interpreter=py311)
    assert res.returncode == 23 and "ok" in res.stdout, res.describe()
    f = assert_finding_at(res, "dlpack-exchange-contract", XK, "nogil", event="exchange-call",
                          innermost=False)
    assert "without the GIL" in f["message"] and "from_py" in f["message"], f["message"]
    assert kinds(res.report) == {"dlpack-exchange-contract"}, summarize(res.report)


def test_xapi_bad_tensor_to_py(tmp_path, py311):
    """A 1.3 tensor with NULL strides handed to to_py (R16)."""
    res = run_capsan(XK, tmp_path, args=["bad_tensor"], interpreter=py311)
    assert res.returncode == 23 and "ok" in res.stdout, res.describe()
    f = assert_finding_at(res, "dlpack-bad-tensor", XK, "nostrides", event="check")
    assert "strides is NULL" in f["message"], f["message"]
    assert kinds(res.report) == {"dlpack-bad-tensor"}, summarize(res.report)


def test_xapi_stale_view(tmp_path, py311):
    """A view's tensor dropped inside the call that still reads the view."""
    res = run_capsan(XK, tmp_path, args=["stale_view"], interpreter=py311)
    assert res.returncode == 23 and "ok" in res.stdout, res.describe()
    f = assert_finding_at(res, "dlpack-stale-view", XK, "stale", event="free", innermost=False)
    assert event_names(f)[0] == "exchange-view", event_names(f)
    assert kinds(res.report) == {"dlpack-stale-view"}, summarize(res.report)


def test_xapi_data_freed(tmp_path, py311):
    """A kernel holds a tensor taken with from_py; resize_ frees its memory."""
    res = run_capsan(XK, tmp_path, args=["data_freed"], interpreter=py311)
    assert res.returncode == 23 and "ok" in res.stdout, res.describe()
    f = assert_finding_at(res, "dlpack-data-freed", XK, "resized", event="free", innermost=False)
    assert event_names(f)[0] == "exchange-from-py", event_names(f)
    # resize_ also rewrote the lent shape (R20), seen at the delete
    assert kinds(res.report) <= {"dlpack-data-freed", "dlpack-bad-tensor"}, summarize(res.report)


def test_xapi_deleter_no_gil(tmp_path, py311):
    """torch runs a to_py tensor's deleter without the GIL when its result
    dies in a worker thread; the kernel's deleter calls PyMem_Free."""
    res = run_capsan(XK, tmp_path, args=["deleter_nogil"], interpreter=py311)
    assert res.returncode == 23 and "ok" in res.stdout, res.describe()
    assert_finding_at(res, "dlpack-deleter-no-gil", XK, "worker-drops", event="call",
                      innermost=False)
    assert kinds(res.report) == {"dlpack-deleter-no-gil"}, summarize(res.report)


def test_xapi_null_deleter(tmp_path, py311):
    """A producer lends a static tensor with a NULL deleter (legal); a kernel
    calls it without checking: the crash is attributed to that tensor."""
    res = run_capsan(XP, tmp_path, args=["null_deleter"], interpreter=py311)
    assert is_signal(res.returncode, 11), res.describe()
    f = assert_finding_at(res, "dlpack-null-deleter", XP, "null-call", innermost=False)
    assert event_names(f)[0] == "exchange-from-py", event_names(f)


def test_xapi_contract_producer_rc_without_error(tmp_path, py311):
    res = run_capsan(XP, tmp_path, args=["from_py_no_error"], interpreter=py311)
    assert res.returncode == 23 and "ok" in res.stdout, res.describe()
    f = assert_finding_at(res, "dlpack-exchange-contract", XP, "no-error", innermost=False)
    assert "without setting a Python exception" in f["message"], f["message"]
    assert kinds(res.report) == {"dlpack-exchange-contract"}, summarize(res.report)


def test_xapi_contract_allocator_set_error(tmp_path, py311):
    res = run_capsan(XP, tmp_path, args=["alloc_no_seterror"], interpreter=py311)
    assert res.returncode == 23 and "ok" in res.stdout, res.describe()
    f = assert_finding_at(res, "dlpack-exchange-contract", XP, "no-seterror", innermost=False)
    assert "SetError 0 time(s)" in f["message"], f["message"]


def test_xapi_bad_table(tmp_path, py311):
    """A table made on the heap without current_work_stream: two warnings
    at the first call through it, and its tensors are still followed."""
    res = run_capsan(XP, tmp_path, args=["heap_table"], interpreter=py311)
    assert res.returncode == 0 and "ok" in res.stdout, res.describe()
    bad = findings(res.report, "dlpack-bad-exchange-table")
    assert len(bad) == 2 and all(f["severity"] == "warning" for f in bad), summarize(res.report)
    msgs = " ".join(f["message"] for f in bad)
    assert "NULL current_work_stream" in msgs and "lies in no loaded object" in msgs, msgs
    assert_finding_at(res, "dlpack-bad-exchange-table", XP, "heap-table", innermost=False)
    assert kinds(res.report) == {"dlpack-bad-exchange-table"}, summarize(res.report)


# ---- import capsan late, suppressions, text and HTML ----

LATE = '''
import gc, torch, xkernel
t = torch.ones(64)
xkernel.total(t)            # xkernel caches torch's table before capsan starts
import capsan
with capsan.trace(check=False) as tr:
    for _ in range(3):
        xkernel.total_leaky(torch.ones(64))  # <-- late-leak
    gc.collect()
print("found", sorted({f.kind for f in tr.findings}), len(tr.findings))
capsan.stop()
print("restored", xkernel.total(t))
'''


def test_late_import_sees_cached_table(tmp_path, py311):
    """`import capsan` after a consumer cached torch's table: the table is
    patched in place at start, so that consumer's tensors are seen."""
    script = tmp_path / "late.py"
    script.write_text(LATE)
    cp = run_plain(script, interpreter=py311,
                   env={"PYTHONPATH": f"{BUILD / 'python'}:{fixdir_for(py311)}"})
    assert cp.returncode == 0, cp.stderr[-3000:]
    assert "found ['dlpack-leak']" in cp.stdout, cp.stdout + cp.stderr[-3000:]
    assert "restored 64.0" in cp.stdout, cp.stdout


LATE_TABLE = '''
import sys, torch, xkernel, xproducer
assert xkernel.total(xproducer.HeapBlob(4)) == 6.0  # read and cached before capsan starts
import capsan
with capsan.trace(check=False) as tr:
    if sys.argv[1] == "use":
        assert xkernel.total(xproducer.HeapBlob(4)) == 6.0
every = capsan.findings()  # the whole session's, the start's included
print("found", sorted({f.kind for f in tr.findings}), len(tr.findings), len(every))
'''


@pytest.mark.parametrize("use", [True, False])
def test_late_import_judges_a_table_at_its_first_use(tmp_path, py311, use):
    """A bad table that a consumer read before `import capsan` is followed
    from the loaded type at start, and judged (R50) at the first call
    through it then, not at start: a table nobody calls (as tvm-ffi's test
    wrapper's) is not reported."""
    script = tmp_path / "late_table.py"
    script.write_text(LATE_TABLE)
    cp = run_plain(script, interpreter=py311, args=["use" if use else "idle"],
                   env={"PYTHONPATH": f"{BUILD / 'python'}:{fixdir_for(py311)}"})
    assert cp.returncode == 0, cp.stderr[-3000:]
    want = "found ['dlpack-bad-exchange-table'] 2 2" if use else "found [] 0 0"
    assert want in cp.stdout, cp.stdout + cp.stderr[-3000:]


def test_suppression_covers_exchange_tensors(tmp_path, py311):
    supp = tmp_path / "supp.txt"
    supp.write_text("leak:total_leaky\nleak:xkernel.so\n")
    res = run_capsan(XK, tmp_path, args=["leak"], interpreter=py311,
                     options=[f"suppressions={supp}"])
    assert res.returncode == 0, res.describe()
    assert "dlpack-leak" not in res.stderr.split("SUMMARY")[0], res.stderr[-3000:]


def test_describe_shows_torch_table(tmp_path, py311):
    code = ("import torch, capsan\n"
            "d = capsan.describe(torch.Tensor)\n"
            "print(d.text)\n"
            "x = d['exchange_api']\n"
            "assert x['version'] == [1, 3], x\n"
            "assert all(e['module'] == 'libtorch_python.so' for e in x['entries'].values()), x\n"
            "print(capsan.describe(torch.zeros(2)).text)\n")
    cp = subprocess.run([str(py311), "-c", code], capture_output=True, text=True, timeout=120,
                        env={**os.environ, "PYTHONPATH": str(BUILD / "python"),
                             "CAPSAN_OPTIONS": f"log_path={tmp_path / 't'}"})
    assert cp.returncode == 0, cp.stderr[-3000:]
    assert "torch.Tensor: DLPack C exchange API" in cp.stdout, cp.stdout
    assert "managed_tensor_from_py_object_no_sync" in cp.stdout, cp.stdout
    assert "[followed by capsan]" in cp.stdout, cp.stdout
    assert "DLPack capsule 'dltensor_versioned'" in cp.stdout, cp.stdout


def test_text_report_timeline(tmp_path, py311):
    """The text report names the exchange events in order."""
    res = run_capsan(XK, tmp_path, args=["double_delete"], interpreter=py311,
                     options=["protect=1"])
    err = res.stderr
    i = err.find("allocated through the exchange table")
    j = err.find("handed to managed_tensor_to_py_object_no_sync")
    assert 0 <= i < j, err[-4000:]
    line = marker_line(XK, "handed")
    assert f"xk_kernels.py:{line}" in err, err[-4000:]


PLUGIN_TESTS = '''
import torch
import xkernel


def test_kernel_leaks():
    for _ in range(3):
        xkernel.total_leaky(torch.ones(32))  # <-- plugin-leak


def test_kernel_clean():
    t = torch.ones(32)
    assert xkernel.scale(t, 2.0).sum() == 64.0
    assert xkernel.total(t) == 32.0
'''


def test_pytest_plugin_fails_the_leaking_test(tmp_path, py311):
    """pytest --capsan: a test whose kernel never deletes what from_py gave
    it fails with dlpack-leak at that line; the clean one passes."""
    suite = tmp_path / "suite"
    suite.mkdir()
    path = suite / "test_kernels.py"
    path.write_text(PLUGIN_TESTS)
    env = {k: v for k, v in os.environ.items()
           if k not in ("LD_PRELOAD", "CAPSAN_OPTIONS", "PYTEST_ADDOPTS", "PYTEST_PLUGINS")}
    env.update(PYTHONPATH=f"{BUILD / 'python'}:{fixdir_for(py311)}", PYTHONDONTWRITEBYTECODE="1",
               OMP_NUM_THREADS="1", CAPSAN_OPTIONS=f"log_path={tmp_path / 't'}")
    cp = subprocess.run([str(py311), "-m", "pytest", "-p", "no:cacheprovider", "-rfE", "--capsan",
                         path.name], capture_output=True, text=True, env=env, timeout=180,
                        cwd=str(suite), stdin=subprocess.DEVNULL)
    out = cp.stdout
    assert cp.returncode == 1, out[-4000:] + cp.stderr[-2000:]
    assert "FAILED test_kernels.py::test_kernel_leaks" in out, out[-4000:]
    assert "test_kernel_clean" not in out.split("short test summary")[-1], out[-4000:]
    line = marker_line(path, "plugin-leak")
    assert f"dlpack-leak x" in out and f"test_kernels.py:{line}" in out, out[-4000:]


def test_tensors_held_in_globals_never_cleared(tmp_path, py311):
    """tvm-ffi's registry keeps a registered function's module globals past
    finalization; tvm-ffi containers of torch tensors taken through the
    exchange API, kept there, were four dlpack-leak errors. At atexit
    capsan asks the tvm-ffi objects a never-cleared module reaches for their
    tensors' data: held. The lost NumPy reference is still a leak."""
    script = SCENARIOS / "xapi_kept_globals.py"
    res = run_capsan(script, tmp_path, interpreter=py311)
    assert "done 3" in res.stdout, res.describe()
    assert kinds(res.report) == {"numpy-leak"}, res.describe()
    assert_finding_at(res, "numpy-leak", script, "lost", innermost=False)
