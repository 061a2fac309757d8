"""numpy 2 (issue 13, part 2): every numpy-* finding kind and the clean NumPy
scenarios on the current-stack venvs, with the Debian suites' own checks.

The checks are test_numpy_findings.py's, test_numpy_clean.py's,
test_gil.py's and test_allocator.py's check_* functions, given a venv's python instead of
Debian's: the same fixtures (built for that interpreter), the same
scenarios, the same kinds and the same scenario lines (`# <-- tag`). All of
them run on cp311 (numpy 2.4); a representative subset also runs on cp310
(numpy 2.2), cp312 and cp313 (numpy 2.5).

What numpy 2 changed under capsan, and where capsan follows it:
- numpy.core became numpy._core; numpy.core is a shim that warns on every
  attribute. The runtime's tracing handler (numpy_api() in preload/numpy/numpy.c),
  capsan.allocator and the scenarios (np_common.multiarray) use
  numpy._core first: test_no_deprecation_warnings.
- array_dealloc no longer calls getenv("NUMPY_WARN_IF_NO_MEM_POLICY") before
  it free()s an OWNDATA array's data that has no handler (numpy 2 reads the
  flag once at import; _set_numpy_warn_if_no_mem_policy() sets it). capsan
  recognised that free by the getenv; it now knows the free() call site in
  array_dealloc itself (hook_free), on numpy 1.24 and 2 alike.
- numpy 2.5 allocates with PyMem_Raw* and asks PyTraceMalloc_Untrack whether
  tracemalloc is tracing (-2: no), then skips the Track of a block a
  handler reallocated and of the blocks it allocates without a handler.
  capsan would see those freed but never made, and a block reallocated in
  place (ndarray.resize(0)) freed twice. numpy's own module hears "tracing"
  from capsan (which is tracing that domain): test_resize_in_place_is_clean,
  and test_numpy_domain_under_tracemalloc shows tracemalloc's own numbers
  are what they are without capsan.
- The realloc's Untrack and Track return addresses lie 38 bytes apart in
  numpy 2.2 and 2.4 (16 in 1.24): capsan's window for pairing them grew to 64.
- numpy >= 2.1 refuses a handler capsule not named "mem_handler" with
  ValueError, so nothing is installed and there is nothing to report (the
  misnamed case of check_bad_handler_whole_run).
- numpy 2 imports numpy.random lazily, at first use: its module data is
  then made inside whatever trace scope or handler is current. Blocks made
  by an import inside a capsan.trace() scope are module data, as at exit
  (test_import_inside_trace_is_module_data).
- numpy 2's _ArrayFunctionDispatcher has no GC support: a reference cycle
  through one is a true leak (test_dispatcher_cycle_is_a_leak), the one
  numpy 2's own test_new_policy shows (test_numpy_suites.py).
"""
import subprocess
import sys

import pytest

from conftest import (CAPSAN, SCENARIOS, STATIC_PY, base_env, current_python, findings,
                      marker_line, no_core, process_of, run_capsan, summarize)

sys.path.insert(0, str(SCENARIOS))
from np_testlib import PYDIR, np_env, numpy_version  # noqa: E402

import test_allocator as A  # noqa: E402
import test_gil as G  # noqa: E402
import test_numpy_clean as C  # noqa: E402
import test_numpy_findings as F  # noqa: E402

FULL = ["cp311"]                          # numpy 2.4: every check
SUBSET = ["cp310", "cp311", "cp312", "cp313"]  # numpy 2.2, 2.4, 2.5, 2.5


def np2(tag):
    """The venv's python, its fixtures built; it must have numpy 2."""
    py = current_python(tag)
    assert numpy_version(py) >= (2, 0), f"{tag} has numpy {numpy_version(py)}, not 2.x"
    return py


# ---------------------------------------------------------------- numpy-leak

@pytest.mark.parametrize("tag", SUBSET)
def test_leak_keep_forever(tmp_path, tag):
    F.check_leak_keep_forever(tmp_path, np2(tag))


@pytest.mark.parametrize("tag", FULL)
def test_leak_refcount(tmp_path, tag):
    F.check_leak_refcount(tmp_path, np2(tag))


@pytest.mark.parametrize("tag", FULL)
def test_leak_fixed_is_clean(tmp_path, tag):
    F.check_leak_fixed_is_clean(tmp_path, np2(tag))


@pytest.mark.parametrize("tag", SUBSET)
def test_leak_at_exit(tmp_path, tag):
    F.check_leak_at_exit(tmp_path, np2(tag))


@pytest.mark.parametrize("tag", FULL)
def test_exit_leaks_grouped_live(tmp_path, tag):
    F.check_exit_leaks_grouped_live(tmp_path, np2(tag))


# ---------------------------------------------------------------- numpy-foreign-free

@pytest.mark.parametrize("tag", SUBSET)
def test_foreign_free_offset16_really_crashes(tmp_path, tag):
    F.check_foreign_free_offset16_really_crashes(tmp_path, np2(tag))


@pytest.mark.parametrize("tag", FULL)
def test_foreign_free_exact_trace(tmp_path, tag):
    F.check_foreign_free_exact_trace(tmp_path, np2(tag))


@pytest.mark.parametrize("tag", SUBSET)
def test_foreign_free_exact_whole_run(tmp_path, tag):
    F.check_foreign_free_exact_whole_run(tmp_path, np2(tag))


@pytest.mark.parametrize("tag", FULL)
def test_foreign_memory_through_a_capsule_base_is_clean(tmp_path, tag):
    F.check_foreign_memory_through_a_capsule_base_is_clean(tmp_path, np2(tag))


# ---------------------------------------------------------------- numpy-double-free

@pytest.mark.parametrize("tag", SUBSET)
def test_double_free_really_crashes(tmp_path, tag):
    F.check_double_free_really_crashes(tmp_path, np2(tag))


@pytest.mark.parametrize("tag", FULL)
def test_double_free_trace(tmp_path, tag):
    F.check_double_free_trace(tmp_path, np2(tag))


# ---------------------------------------------------------------- numpy-stale-handler

@pytest.mark.parametrize("tag", SUBSET)
def test_stale_handler_swapped_in_place(tmp_path, tag):
    F.check_stale_handler_swapped_in_place(tmp_path, np2(tag))


@pytest.mark.parametrize("tag", SUBSET)
def test_pool_switch_in_place(tmp_path, tag):
    F.check_pool_switch_in_place(tmp_path, np2(tag))


@pytest.mark.parametrize("tag", SUBSET)
def test_pool_switch_clean(tmp_path, tag):
    F.check_pool_switch_clean(tmp_path, np2(tag))


@pytest.mark.parametrize("tag", FULL)
def test_stale_handler_struct_freed(tmp_path, tag):
    F.check_stale_handler_struct_freed(tmp_path, np2(tag))


@pytest.mark.parametrize("tag", FULL)
def test_stale_handler_ctx_freed(tmp_path, tag):
    F.check_stale_handler_ctx_freed(tmp_path, np2(tag))


@pytest.mark.parametrize("tag", FULL)
def test_stale_handler_two_arrays(tmp_path, tag):
    F.check_stale_handler_two_arrays(tmp_path, np2(tag))


@pytest.mark.parametrize("tag", FULL)
def test_stale_handler_crash_at_first_free(tmp_path, tag):
    F.check_stale_handler_crash_at_first_free(tmp_path, np2(tag))


# ---------------------------------------------------------------- numpy-bad-handler

@pytest.mark.parametrize("mode", sorted(F.BAD))
@pytest.mark.parametrize("tag", FULL)
def test_bad_handler_whole_run(tmp_path, tag, mode):
    F.check_bad_handler_whole_run(tmp_path, mode, np2(tag))


@pytest.mark.parametrize("mode", ["v2", "misnamed"])
@pytest.mark.parametrize("tag", [t for t in SUBSET if t not in FULL])
def test_bad_handler_whole_run_subset(tmp_path, tag, mode):
    F.check_bad_handler_whole_run(tmp_path, mode, np2(tag))


@pytest.mark.parametrize("tag", FULL)
def test_bad_handler_trace(tmp_path, tag):
    F.check_bad_handler_trace(tmp_path, np2(tag))


# ---------------------------------------------------------------- numpy-handler-no-gil

@pytest.mark.parametrize("tag", SUBSET)
def test_numpy_handler_without_gil(tmp_path, tag):
    G.check_numpy_handler_without_gil(tmp_path, np2(tag))


# ---------------------------------------------------------------- clean NumPy code

@pytest.mark.parametrize("tag", FULL)
def test_clean_plain_run_works(tag):
    C.check_plain_run_works(np2(tag))


@pytest.mark.parametrize("tag", SUBSET)
def test_clean_under_trace(tmp_path, tag):
    C.check_clean_under_trace(tmp_path, np2(tag))


@pytest.mark.parametrize("section", C.SECTIONS)
@pytest.mark.parametrize("tag", FULL)
def test_clean_section_under_trace(tmp_path, tag, section):
    C.check_clean_section_under_trace(tmp_path, section, np2(tag))


@pytest.mark.parametrize("tag", SUBSET)
def test_clean_whole_run(tmp_path, tag):
    C.check_clean_whole_run(tmp_path, np2(tag))


@pytest.mark.parametrize("tag", FULL)
def test_clean_whole_run_bare_preload(tmp_path, tag):
    C.check_clean_whole_run(tmp_path, np2(tag), mode="preload")


@pytest.mark.parametrize("tag", FULL)
def test_trace_inside_capsan_run(tmp_path, tag):
    C.check_trace_inside_capsan_run(tmp_path, np2(tag))


# ---------------------------------------------------------------- capsan.allocator

@pytest.mark.parametrize("tag", FULL)
def test_mem_policy_plain(tmp_path, tag):
    A.check_mem_policy_plain(tmp_path, np2(tag))


@pytest.mark.parametrize("tag", SUBSET)
def test_mem_policy_under_capsan_clean(tmp_path, tag):
    A.check_mem_policy_under_capsan_clean(tmp_path, np2(tag))


@pytest.mark.parametrize("tag", FULL)
def test_ready_made_plain(tmp_path, tag):
    A.check_ready_made_plain(tmp_path, np2(tag))


@pytest.mark.parametrize("tag", FULL)
def test_ready_made_under_capsan_clean(tmp_path, tag):
    A.check_ready_made_under_capsan_clean(tmp_path, np2(tag))


@pytest.mark.parametrize("tag", FULL)  # the venv with torch
def test_declared_device_reaches_the_runtime(tmp_path, tag):
    A.check_declared_device_reaches_the_runtime(tmp_path, np2(tag))


# ---------------------------------------------------------------- what numpy 2 changed

def run_code(py, code, tmp_path, *, capsan=True, env=None, pyargs=()):
    """`py code` with build/python and py's fixtures on the path, under
    `capsan run` or plainly. Returns (CompletedProcess, report or None)."""
    from conftest import capsan_report, trace_files
    tmp_path.mkdir(parents=True, exist_ok=True)
    script = tmp_path / "prog.py"
    script.write_text(code)
    e = base_env(env, py)
    e["PYTHONPATH"] = np_env(py)["PYTHONPATH"]
    cmd = [str(py), *pyargs, str(script)]
    if capsan:
        cmd = [str(CAPSAN), "run", "--keep-trace", "--log-path", str(tmp_path / "t"), "--", *cmd]
    cp = subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=e,
                        stdin=subprocess.DEVNULL, preexec_fn=no_core, cwd=str(tmp_path))
    traces = trace_files(tmp_path)
    return cp, (capsan_report(traces)[1] if traces else None)


NO_WARNINGS = """
import numpy as np
import capsan
with capsan.trace() as t:
    a = np.ones(100)
    del a
assert t.findings == [], t.findings
assert capsan.handler_name() == "default_allocator", capsan.handler_name()
with capsan.using(capsan.allocators.aligned(64)):
    b = np.ones(100)
assert capsan.handler_name(b) == "aligned64", capsan.handler_name(b)
assert capsan.handler_version(b) == 1
print("ok")
"""


@pytest.mark.parametrize("tag", SUBSET)
def test_no_deprecation_warnings(tmp_path, tag):
    """capsan.trace(), capsan.using() and handler_name() on numpy 2 reach
    numpy._core, not the deprecated numpy.core: with DeprecationWarning an
    error they work (the runtime's numpy_api() once took _ARRAY_API from
    numpy.core._multiarray_umath and failed)."""
    py = np2(tag)
    cp, _ = run_code(py, NO_WARNINGS, tmp_path, capsan=False,
                     pyargs=["-W", "error::DeprecationWarning"])
    assert cp.returncode == 0 and cp.stdout.strip() == "ok", cp.stdout + cp.stderr
    assert "Warning" not in cp.stderr, cp.stderr


RESIZE = """
import numpy as np
for i in range(50):
    b = np.arange(10.0)
    b.resize(0, refcheck=False)   # in place: the same block, 1 byte
    c = np.arange(10.0)
    c.resize((1000,), refcheck=False)
    del b, c
v = [np.void(b"x" * 5) for _ in range(20)]   # numpy's own small-block cache, no handler
del v
print("done")
"""


@pytest.mark.parametrize("tag", SUBSET)
def test_resize_in_place_is_clean(tmp_path, tag):
    """ndarray.resize reallocates through the handler. numpy 2.5 skips the
    Track of the new block when Untrack says tracemalloc is off: without
    capsan answering for numpy's domain, a block reallocated in place was
    freed twice (a false numpy-double-free) and every realloc'd block was
    seen freed but never made. Every block must be seen made and freed."""
    py = np2(tag)
    cp, rep = run_capsan_code(py, RESIZE, tmp_path)
    assert cp.returncode == 0 and "done" in cp.stdout, cp.stdout + cp.stderr
    assert rep is not None and findings(rep) == [], summarize(rep)
    # 100 reallocations, 100 arrays, 20 void scalars: each made and freed
    assert process_of(rep)["summary"]["events"] >= 2 * (100 + 20), summarize(rep)


def run_capsan_code(py, code, tmp_path, **kw):
    return run_code(py, code, tmp_path, capsan=True, env={"CAPSAN_OPTIONS": "record_all=1"}, **kw)


TRACEMALLOC = """
import tracemalloc
import numpy as np
tracemalloc.start()
a = np.ones(10**5)
b = np.arange(1000.0)
b.resize(50000, refcheck=False)
snap = tracemalloc.take_snapshot().filter_traces(
    [tracemalloc.DomainFilter(True, np.lib.tracemalloc_domain)])
print(sum(s.size for s in snap.statistics("filename")))
tracemalloc.stop()
"""


@pytest.mark.parametrize("tag", SUBSET)
def test_numpy_domain_under_tracemalloc(tmp_path, tag):
    """With tracemalloc on, numpy's own domain counts the same bytes under
    capsan as without it: capsan only answers for tracemalloc when the
    interpreter says it is off."""
    py = np2(tag)
    plain, _ = run_code(py, TRACEMALLOC, tmp_path / "plain", capsan=False)
    under, rep = run_code(py, TRACEMALLOC, tmp_path / "capsan")
    assert plain.returncode == 0 and under.returncode == 0, plain.stderr + under.stderr
    assert int(plain.stdout) == int(under.stdout) >= 8 * (10**5 + 50000), (plain.stdout,
                                                                        under.stdout)
    assert findings(rep) == [], summarize(rep)


IMPORT_IN_SCOPE = """
import sys
import numpy as np
import capsan
sys.path.insert(0, sys.argv[1])
with capsan.trace() as t:
    import modwithdata            # a module-level array, made by the import
    kept = np.ones(10)            # <-- kept
print("findings", [(f.kind, f.at) for f in t.findings])
"""


@pytest.mark.parametrize("tag", ["static"] + SUBSET)
def test_import_inside_trace_is_module_data(tmp_path, tag):
    """A module imported for the first time inside capsan.trace() keeps its
    module-level arrays: module data, as at exit, not numpy-leak (numpy 2
    imports numpy.random lazily, so its first use inside a scope does this).
    An array the scope itself keeps is still one."""
    py = STATIC_PY if tag == "static" else np2(tag)
    (tmp_path / "modwithdata.py").write_text("import numpy as np\nDATA = np.arange(100.0)\n")
    script = tmp_path / "prog.py"
    script.write_text(IMPORT_IN_SCOPE)
    e = base_env(None, py)
    e["PYTHONPATH"] = f"{PYDIR}"
    cp = subprocess.run([str(py), str(script), str(tmp_path)], capture_output=True, text=True,
                        timeout=120, env=e, stdin=subprocess.DEVNULL, preexec_fn=no_core,
                        cwd=str(tmp_path))
    assert cp.returncode == 0, cp.stderr
    line = marker_line(script, "kept")
    assert f"findings [('numpy-leak', 'prog.py:{line}')]" in cp.stdout, cp.stdout + cp.stderr


@pytest.mark.parametrize("tag", ["static"] + SUBSET)
def test_dispatcher_cycle_is_a_leak(tmp_path, tag):
    """numpy 2's _ArrayFunctionDispatcher has no GC support, so the cycle
    test_overrides.py::test_dispatcher_error builds (frame, dispatched
    function, dispatcher closure, exception, traceback, frame) is never
    collected: the array the frame holds is a true numpy-leak at exit, at
    its line (tests/scenarios/np_dispatch_leak.py). numpy 1.24's dispatcher
    was a Python function: clean. This is what numpy 2's test_new_policy
    leaks at exit (test_numpy_suites.py)."""
    from np_testlib import assert_at
    py = STATIC_PY if tag == "static" else np2(tag)
    script = SCENARIOS / "np_dispatch_leak.py"
    res = run_capsan(script, tmp_path, env=np_env(py), interpreter=py)
    assert "got 999.0" in res.stdout, res.describe()
    if numpy_version(py) < (2, 0):
        assert res.returncode == 0 and findings(res.report) == [], res.describe()
        return
    assert res.returncode == 23, res.describe()
    fs = findings(res.report)
    assert [f["kind"] for f in fs] == ["numpy-leak"] and fs[0]["bytes"] == 8000, summarize(res.report)
    assert_at(fs, "numpy-leak", script, "pinned", event="alloc")
