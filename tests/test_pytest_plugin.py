"""The pytest plugin (capsan.pytest_plugin): `--capsan`, the `capsan`
marker, the `capsan_trace` fixture, per-test attribution, the terminal
summary and the JSON report; registered through the generated
capsan-0.1.dist-info (autoload) and through `-p capsan.pytest_plugin`, from
the checkout build and from an installed tree. Each case runs pytest in a
subprocess on a generated test file."""
import json
import re
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from conftest import (CAPSAN, DEFAULT_EXITCODE, LIBCAPSAN, ROOT, STATIC_PY, base_env,
                      check_crash_report, current_python, fixdir_for, marker_line, no_core)

sys.path.insert(0, str(ROOT / "tests" / "scenarios"))
from np_testlib import PYDIR, require_np  # noqa: E402

DIST = PYDIR / "capsan-0.1.dist-info"

TESTS = '''
import numpy as np
import pytest
import dlconsumer as C
import dlproducer as P
import np_leaky as L


def test_clean():
    a = np.ones(100)
    assert a.sum() == 100


def test_leaks():
    a = np.ones(1000)  # <-- leak
    L.keep_forever(a)


@pytest.mark.capsan(allow=["numpy-leak"])
def test_allowed_leak():
    L.keep_forever(np.ones(10))  # <-- allowed


@pytest.mark.capsan(check=False)
def test_unchecked_leak():
    L.keep_forever(np.ones(20))


def test_double_delete():
    C.double_delete(P.good(4))  # <-- dlpack


def test_fixture(capsan_trace):
    assert capsan_trace.active
    C.double_delete(P.good(4))
    assert [f.kind for f in capsan_trace.findings] == ["dlpack-double-delete"]


@pytest.fixture
def holder():
    box = []
    yield box
    box.clear()  # a function-scoped fixture keeps arrays until teardown: no leak


def test_fixture_holds_arrays(holder):
    holder.append(np.ones(50))


@pytest.fixture
def bad_teardown():
    yield
    C.double_delete(P.good(4))  # <-- teardown


def test_teardown_finding(bad_teardown):
    pass


def test_fails_itself():
    a = np.ones(10)
    assert a.sum() == 0
'''

EXPECTED_FAILED = {"test_leaks", "test_double_delete", "test_fixture", "test_teardown_finding",
                   "test_fails_itself"}


def write_tests(tmp_path, text=TESTS, name="test_sample.py"):
    d = tmp_path / "suite"
    d.mkdir(exist_ok=True)
    p = d / name
    p.write_text(textwrap.dedent(text))
    return p


def pytest_run(tmp_path, args, *, pythonpath=None, preload=False, options=("protect=1",),
               env=None, timeout=120, python=STATIC_PY):
    require_np(python)
    e = base_env()
    e["PYTHONPATH"] = f"{pythonpath or PYDIR}:{fixdir_for(python)}"
    e["CAPSAN_OPTIONS"] = ":".join([f"log_path={tmp_path / 't'}", *options])
    e.pop("PYTEST_ADDOPTS", None)
    e.pop("PYTEST_PLUGINS", None)
    e.pop("PYTEST_DISABLE_PLUGIN_AUTOLOAD", None)
    if preload:
        e["LD_PRELOAD"] = str(LIBCAPSAN)
    if env:
        e.update(env)
    cmd = [str(python), "-m", "pytest", "-p", "no:cacheprovider", "-rfE", *args]
    cp = subprocess.run(cmd, capture_output=True, text=True, env=e, timeout=timeout,
                        cwd=str(tmp_path / "suite"), stdin=subprocess.DEVNULL, preexec_fn=no_core)
    cp.describe = (f"command: {' '.join(cmd)}\nrc={cp.returncode}\n--- stdout\n{cp.stdout[-8000:]}"
                   f"\n--- stderr\n{cp.stderr[-3000:]}")
    return cp


def outcomes(cp):
    """{test name: 'passed'/'failed'/'error'} from `-rA`-less output: the -rfE
    short summary lists failures and errors; everything else passed."""
    out = {}
    for line in cp.stdout.splitlines():
        for word in ("FAILED", "ERROR"):
            if line.startswith(word + " "):
                nodeid = line.split()[1]
                name = nodeid.split("::")[-1]
                out[name] = word.lower() if name not in out else out[name] + "+" + word.lower()
    return out


def test_dist_info_is_generated():
    require_np()
    ep = (DIST / "entry_points.txt").read_text()
    assert "[pytest11]" in ep and "capsan = capsan.pytest_plugin" in ep, ep
    meta = (DIST / "METADATA").read_text()
    assert "Name: capsan" in meta and "Version: 0.1" in meta, meta


def check_full_run(cp, path):
    got = outcomes(cp)
    assert {k for k, v in got.items() if v.startswith("failed")} == EXPECTED_FAILED, (
        f"{got}\n{cp.describe}")
    assert cp.returncode == 1, cp.describe
    line = marker_line(path, "leak")
    # the short summary names kind and line; the failure text has the stacks
    assert f"FAILED test_sample.py::test_leaks - capsan: numpy-leak at test_sample.py:{line}" \
        in cp.stdout, cp.describe
    assert f"{path}:{line} in test_leaks" in cp.stdout, cp.describe
    text = cp.stdout.split("capsan: 1 finding(s) in test_leaks (setup, call and teardown)")
    assert len(text) == 2, "no capsan failure text for test_leaks\n" + cp.describe
    text = text[1].split("SUMMARY: capsan:")[0]
    assert "ERROR: capsan: numpy-leak" in text and "more frame(s)" in text, text
    assert f"{path}:{line} in test_leaks" in text, text
    assert "_pytest/runner.py" not in text, "pytest's own frames in the failure text\n" + text
    # the terminal summary lists every test with findings
    assert "test(s) with findings" in cp.stdout, cp.describe
    for name in ("test_leaks", "test_allowed_leak", "test_unchecked_leak", "test_double_delete",
                 "test_fixture", "test_teardown_finding"):
        assert f"test_sample.py::{name}: " in cp.stdout, f"{name} not in the summary\n{cp.describe}"
    assert "numpy-leak x1 at test_sample.py:%d (allowed)" % marker_line(path, "allowed") \
        in cp.stdout, cp.describe
    for name in ("test_clean", "test_fixture_holds_arrays", "test_fails_itself"):
        assert f"test_sample.py::{name}: " not in cp.stdout, f"{name} has findings\n{cp.describe}"


def test_capsan_flag_autoloads_from_the_checkout(tmp_path):
    path = write_tests(tmp_path)
    cp = pytest_run(tmp_path, ["--capsan", str(path.name)])
    check_full_run(cp, path)


def test_explicit_plugin_and_autoload_together(tmp_path):
    """-p capsan.pytest_plugin while the dist-info entry point is visible too:
    the module is registered once."""
    path = write_tests(tmp_path)
    cp = pytest_run(tmp_path, ["-p", "capsan.pytest_plugin", "--capsan", path.name])
    assert "already registered" not in cp.stderr + cp.stdout, cp.describe
    check_full_run(cp, path)


def test_explicit_plugin_without_autoload(tmp_path):
    path = write_tests(tmp_path)
    cp = pytest_run(tmp_path, ["-p", "capsan.pytest_plugin", "--capsan", path.name],
                    env={"PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"})
    check_full_run(cp, path)


def test_without_flag_only_marked_and_fixture_tests_are_traced(tmp_path):
    path = write_tests(tmp_path)
    cp = pytest_run(tmp_path, [path.name])
    got = outcomes(cp)
    # test_leaks and test_double_delete are not traced; test_fixture is (it asks)
    assert {k for k, v in got.items() if v.startswith("failed")} == {"test_fixture",
                                                                     "test_fails_itself"}, (
        f"{got}\n{cp.describe}")
    assert "test_sample.py::test_allowed_leak: numpy-leak x1" in cp.stdout, cp.describe
    assert "test_sample.py::test_leaks" not in cp.stdout.split("short test summary")[0].split(
        "test(s) with findings")[-1], cp.describe


def test_json_report_attributes_findings_to_tests(tmp_path):
    path = write_tests(tmp_path)
    out = tmp_path / "capsan.json"
    cp = pytest_run(tmp_path, ["--capsan", f"--capsan-report={out}", path.name])
    assert out.exists(), cp.describe
    rep = json.loads(out.read_text())
    assert rep["tool"] == "capsan"
    per = {t["nodeid"].split("::")[-1]: [f["kind"] for f in t["findings"]] for t in rep["tests"]}
    assert per["test_clean"] == [] and per["test_fixture_holds_arrays"] == [], per
    assert per["test_leaks"] == ["numpy-leak"], per
    assert per["test_allowed_leak"] == ["numpy-leak"], per
    assert per["test_double_delete"] == ["dlpack-double-delete"], per
    assert per["test_fixture"] == ["dlpack-double-delete"], per
    assert per["test_teardown_finding"] == ["dlpack-double-delete"], per
    assert per["test_fails_itself"] == [], per  # a failing test's arrays are not leaks
    allowed = {t["nodeid"].split("::")[-1]: [f["allowed"] for f in t["findings"]]
               for t in rep["tests"]}
    assert allowed["test_allowed_leak"] == [True] and allowed["test_leaks"] == [False], allowed
    # the line of the teardown's finding is the fixture's
    t, = [t for t in rep["tests"] if t["nodeid"].endswith("test_teardown_finding")]
    lines = {fr["line"] for ev in t["findings"][0]["events"] for fr in ev["stack"]
             if fr["python"] and fr["file"].endswith("test_sample.py")}
    assert marker_line(path, "teardown") in lines, lines


def test_loading_the_plugin_does_not_start_the_runtime(tmp_path):
    """The entry point is seen by every pytest run that can import capsan: unless
    a test asks for capsan, the runtime stays off and writes nothing."""
    path = write_tests(tmp_path, '''
        import numpy as np

        def test_runtime_is_off():
            import capsan
            assert not capsan.active()
            a = np.ones(10)
            del a
    ''', name="test_off.py")
    cp = pytest_run(tmp_path, [path.name])
    assert cp.returncode == 0, cp.describe
    assert not list(tmp_path.glob("t.*")), "a trace file was written"
    assert "capsan:" not in cp.stdout, cp.describe


def test_installed_tree(tmp_path):
    """`make install PREFIX=...`: the package, the dist-info and the runtime
    land under PREFIX; `pytest --capsan` works with the package's site dir
    (pyhook/install_tree.py --print-site) on PYTHONPATH and binds
    PREFIX/lib/libcapsan.so. (tests/test_install.py covers the layout.)"""
    prefix = tmp_path / "prefix"
    mk = subprocess.run(["make", "-s", "-o", "all", "-C", str(ROOT), "install", f"PREFIX={prefix}",
                         f"PYTHON={STATIC_PY}", "DESTDIR="],
                        capture_output=True, text=True, timeout=120)
    assert mk.returncode == 0, mk.stdout + mk.stderr
    pyd = Path(subprocess.check_output([str(STATIC_PY), str(ROOT / "pyhook" / "install_tree.py"),
                                        "--print-site", "--prefix", str(prefix)], text=True).strip())
    assert (pyd / "capsan" / "pytest_plugin.py").exists()
    assert (pyd / "capsan-0.1.dist-info" / "entry_points.txt").exists()
    assert (prefix / "lib" / "libcapsan.so").exists()
    path = write_tests(tmp_path)
    (path.parent / "test_where.py").write_text(textwrap.dedent(f'''
        def test_where():
            import capsan
            assert capsan.library_path == {str(prefix / "lib" / "libcapsan.so")!r}
    '''))
    cp = pytest_run(tmp_path, ["--capsan", path.name, "test_where.py"], pythonpath=pyd)
    check_full_run(cp, path)
    assert "test_where" not in outcomes(cp), cp.describe


def test_under_preload(tmp_path):
    """LD_PRELOAD + --capsan: the plugin binds the preloaded runtime; the
    per-test findings are the same, and the runtime's exit status is 23."""
    path = write_tests(tmp_path)
    cp = pytest_run(tmp_path, ["--capsan", path.name], preload=True)
    got = outcomes(cp)
    assert {k for k, v in got.items() if v.startswith("failed")} == EXPECTED_FAILED, (
        f"{got}\n{cp.describe}")
    assert cp.returncode == DEFAULT_EXITCODE, cp.describe
    cp0 = pytest_run(tmp_path, ["--capsan", path.name], preload=True,
                     options=("protect=1", "exitcode=0"))
    assert cp0.returncode == 1, cp0.describe


def test_missing_runtime_breaks_only_runs_that_ask_for_capsan(tmp_path):
    """A package and dist-info without their libcapsan.so: pytest runs that do
    not use capsan are unaffected; --capsan is a usage error naming the cause."""
    import shutil
    pyd = tmp_path / "lonely"
    shutil.copytree(PYDIR / "capsan", pyd / "capsan")
    shutil.copytree(DIST, pyd / DIST.name)
    path = write_tests(tmp_path, '''
        def test_plain():
            assert True
    ''', name="test_plain.py")
    cp = pytest_run(tmp_path, [path.name], pythonpath=pyd)
    assert cp.returncode == 0, cp.describe
    cp = pytest_run(tmp_path, ["--capsan", path.name], pythonpath=pyd)
    assert cp.returncode == 4, cp.describe
    assert "libcapsan.so not found" in cp.stderr, cp.describe


TENSOR_TESTS = '''
import numpy as np
import dlconsumer as C
import dlproducer as P


def test_tensor_leak():
    for _ in range(3):
        C.consume_leak(P.good(8))  # <-- tensor-leak


def test_tensor_released():
    batch = np.arange(8, dtype=np.float32)
    C.consume_good(batch.__dlpack__())
    view = np.from_dlpack(batch)
    assert view.sum() == 28.0
'''


def test_tensor_leak_fails_its_test(tmp_path):
    """In API mode a tensor consumed inside a test and referenced nowhere at
    its end is that test's dlpack-leak, at the consumer's line (a producer's
    malloc'd tensor: see test_leak_roots for numpy's export and its
    indirect buffer); nothing is printed live."""
    path = write_tests(tmp_path, TENSOR_TESTS, "test_tensors.py")
    cp = pytest_run(tmp_path, ["--capsan", path.name])
    got = outcomes(cp)
    assert {k for k, v in got.items() if v.startswith("failed")} == {"test_tensor_leak"}, (
        f"{got}\n{cp.describe}")
    line = marker_line(path, "tensor-leak")
    # three leaks; the conservative scan may take one for referenced (a
    # stale pointer to an object that had its address), never all three
    assert re.search(rf"test_tensors.py::test_tensor_leak: dlpack-leak x[123] at "
                     rf"test_tensors.py:{line}\b", cp.stdout), cp.describe
    assert "DLManagedTensor" in cp.stdout and "was consumed but its deleter was never called" \
        in cp.stdout, cp.describe
    # API mode prints nothing live: no finding text outside the plugin's report
    assert "ERROR: capsan:" not in cp.stderr, cp.describe
    assert "Captured stderr" not in cp.stdout, cp.describe


STOPPING = """
import numpy as np
import capsan
import np_leaky as L


def test_a_leaks():
    L.keep_forever(np.ones(100))


def test_b_stops():
    capsan.stop()


def test_c_leaks_unseen():
    L.keep_forever(np.ones(100))
"""


def test_tests_after_a_stop_are_listed_unchecked(tmp_path):
    """A test that calls capsan.stop() ends checking for the session: the
    tests after it run unchecked, and the summary names them, rather than
    passing as checked and clean."""
    write_tests(tmp_path, STOPPING)
    cp = pytest_run(tmp_path, ["--capsan", "-p", "no:randomly"])
    assert cp.returncode == 1, cp.describe
    assert outcomes(cp) == {"test_a_leaks": "failed"}, cp.describe
    assert "capsan: 1 test(s) not checked: capsan.stop() was called before them" in cp.stdout, \
        cp.describe
    assert "test_sample.py::test_c_leaks_unseen" in cp.stdout.split("not checked")[1], cp.describe


HELD = """
import functools
import numpy as np
import pytest
import capsan
import np_leaky as L

keep = []
_cache = {}
pending = []


@functools.lru_cache(maxsize=None)
def table(n):
    return np.arange(n)


class Registry:
    items = {}


@pytest.fixture(scope="session")
def shared():
    return []


def test_global_list():
    keep.append(np.ones(10))


def test_untracked_dict_cache():
    _cache["x"] = np.zeros(100)  # a dict of arrays only: gc does not track it


def test_lru_cache():
    assert table(50)[3] == 3


def test_class_attribute_view():
    Registry.items["a"] = np.zeros((4, 4))[::2]  # the view's base holds the block


def test_session_fixture(shared):
    shared.append(np.empty(9))


def test_export_kept_for_later():
    pending.append(np.ones(6).__dlpack__())  # the capsule's tensor holds the block


def test_extension_keeps_it():
    L.keep_forever(np.ones(7))  # <-- c-leak


def test_refcount_leak():
    a = L.new_leaked(5)  # <-- refcount
    del a


@pytest.mark.capsan(roots=False)
def test_strict():
    keep.append(np.ones(3))  # <-- strict


@pytest.mark.capsan(allow=["numpy-leak"])  # the inner scope's finding is the test's too
def test_with_block_local():
    with capsan.trace(roots=True) as t:
        a = np.ones(4)  # <-- local
    assert [f.kind for f in t.findings] == ["numpy-leak"], t.findings
    del a


def test_with_block_global():
    with capsan.trace(roots=True) as t:
        keep.append(np.ones(4))
    assert t.findings == []
"""


def test_blocks_python_still_reaches_are_held(tmp_path):
    """After a test, a block that Python's roots still reach (a module
    global, a dict cache gc does not track, lru_cache, a class attribute
    holding a view, a session fixture, an unconsumed DLPack export kept in
    a list) is held, as LeakSanitizer's root set decides: the test passes.
    What only a C extension's lost reference keeps alive is still that
    test's numpy-leak, at its line, and roots=False judges held blocks too.
    capsan.trace(roots=True) does not count its own caller's locals."""
    path = write_tests(tmp_path, HELD, "test_held.py")
    cp = pytest_run(tmp_path, ["--capsan", "-p", "no:randomly", path.name])
    got = outcomes(cp)
    assert got == {"test_extension_keeps_it": "failed", "test_refcount_leak": "failed",
                   "test_strict": "failed"}, f"{got}\n{cp.describe}"
    for test, mark in (("test_extension_keeps_it", "c-leak"), ("test_refcount_leak", "refcount"),
                       ("test_strict", "strict")):
        assert re.search(rf"test_held.py::{test}: numpy-leak x1 at test_held.py:"
                         rf"{marker_line(path, mark)}\b", cp.stdout), cp.describe
    assert "UserWarning" not in cp.stdout, cp.describe  # the walk ran no object's code


CRASHING = '''
import ctypes
import os
import dlconsumer as C
import dlproducer as P


def test_a_finding_first():
    C.double_delete(P.good(4))  # protect=1 makes the second delete harmless


def test_crashes():
    if os.environ["CRASH_HOW"] == "abort":
        os.abort()  # <-- abort
    ctypes.string_at(0)  # <-- segv
'''


@pytest.mark.parametrize("how,tag", [("segv", "static"), ("abort", "static"), ("segv", "cp310"),
                                     ("abort", "cp313")])
def test_a_crash_is_reported_past_pytest_capture(tmp_path, how, tag):
    """pytest captures fd 2 (a temporary file dup2'd over it, lost when the
    process dies; faulthandler's "Fatal Python error" alone used to reach
    the terminal): capsan's crash report goes to the stderr the process
    had when the plugin started the runtime, once. It names the signal,
    the test's line, the finding made before the crash, and the `capsan
    report` command, whose trace renders. Debian's pytest 7 and the
    venvs' pytest 9, on 3.10's and 3.13's frame layouts."""
    python = STATIC_PY if tag == "static" else current_python(tag)
    path = write_tests(tmp_path, CRASHING, "test_crashing.py")
    cp = pytest_run(tmp_path, ["--capsan", "-p", "no:randomly", path.name],
                    env={"CRASH_HOW": how}, python=python)
    sig = signal.SIGSEGV if how == "segv" else signal.SIGABRT
    assert cp.returncode == -sig, cp.describe
    line = marker_line(path, how)
    rep, trace = check_crash_report(cp.stderr, sig.name[3:], f"{path.name}:{line} in test_crashes")
    if how == "segv":
        assert re.search(r"==\d+==capsan: Segmentation fault at pc 0x[0-9a-f]+ \(address 0x0\)\n",
                         rep), rep
    else:
        assert re.search(r"==\d+==capsan: Aborted at pc 0x[0-9a-f]+\n", rep), rep
    # faulthandler (pytest enables it) ran first and raised the signal
    # again: the report is about the crash, not about that raise
    assert "another handler (faulthandler's?) ran first" in rep, rep
    assert "1 finding(s) reported before the crash:\n    ERROR dlpack-double-delete: " in rep, rep
    assert trace.parent == tmp_path and trace.name.startswith("t."), trace
    text = subprocess.run([str(CAPSAN), "report", str(trace)], capture_output=True, text=True,
                          timeout=120).stdout
    assert "dlpack-double-delete" in text, text[-3000:]


SHARED = """
import contextvars
import gc
import numpy as np
import np_leaky as L

seen = []
keep = []
contexts = []


class Node:
    pass


def test_a(capsan_trace):
    seen.append(id(capsan_trace.handler))
    assert np.ones(10).sum() == 10


def test_b_holds(capsan_trace):
    seen.append(id(capsan_trace.handler))
    keep.append(np.ones(10))  # its array holds the handler from now on


def test_c_captures(capsan_trace):
    seen.append(id(capsan_trace.handler))
    contexts.append(contextvars.copy_context())  # and so does this context


def test_d_allocates_through_c(capsan_trace):
    seen.append(id(capsan_trace.handler))
    # made through test_c's handler: no block of this test's
    L.keep_forever(contexts[0].run(np.ones, 5))


def test_e_handlers():
    # a handler nothing else holds serves the next test; one an array or a
    # context holds is never another test's
    assert seen[0] == seen[1] and seen[2] != seen[1] and seen[3] != seen[2], seen


def test_young_cycle():
    n = Node()
    n.self, n.a = n, np.ones(8)


def test_old_cycle():
    n = Node()
    n.self, n.a = n, np.ones(8)
    gc.collect()  # n moves to the oldest generation: only a full collection frees it


def test_leak_after_all():
    L.keep_forever(np.ones(12))  # <-- shared-leak
"""


def test_one_handler_serves_the_tests_nothing_else_holds_it_for(tmp_path):
    """The tests share one tracing handler while nothing but the plugin holds
    it; an array or a copied context that holds it retires it, and what is
    made through it later is judged by no other test. A test's garbage
    cycles are collected before its blocks are judged, young or old; a
    leak after all that still fails its test at its line."""
    path = write_tests(tmp_path, SHARED, "test_shared.py")
    cp = pytest_run(tmp_path, ["--capsan", "-p", "no:randomly", path.name])
    assert outcomes(cp) == {"test_leak_after_all": "failed"}, cp.describe
    assert re.search(rf"test_shared.py::test_leak_after_all: numpy-leak x1 at test_shared.py:"
                     rf"{marker_line(path, 'shared-leak')}\b", cp.stdout), cp.describe


TENSOR_LEAK = '''
import dlconsumer as C
import dlproducer as P


def test_tensor_leaks():
    C.consume_leak(P.good(4))  # <-- tensor-leak


def test_tensor_released():
    C.consume_good(P.good(4))
'''


def test_a_tensor_a_test_leaks_fails_it(tmp_path):
    """A DLPack tensor a test consumed and never released, with no NumPy
    block left alive beside it: the test fails with dlpack-leak at its line
    (the plugin's cheap path must not let a list of the scope's keys, freed
    but not cleared, pass for a reference to the tensor)."""
    path = write_tests(tmp_path, TENSOR_LEAK, "test_tensor.py")
    cp = pytest_run(tmp_path, ["--capsan", "-p", "no:randomly", path.name])
    assert outcomes(cp) == {"test_tensor_leaks": "failed"}, cp.describe
    assert re.search(rf"test_tensor.py::test_tensor_leaks: dlpack-leak x1 at test_tensor.py:"
                     rf"{marker_line(path, 'tensor-leak')}\b", cp.stdout), cp.describe
