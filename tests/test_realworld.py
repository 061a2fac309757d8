"""Bugs that shipped in released libraries (issue 20): each is installed
from the package registry into a venv of .ci/realworld, triggered by the
smallest program, verified natively (an abort, a crash), caught by capsan
with the right kind and Python line, and its fixed release (a venv of
.ci/venvs, or of .ci/realworld beside the buggy one) is silent."""
import subprocess
from pathlib import Path

import pytest

from conftest import (SCENARIOS, STATIC_PY, assert_finding_at, base_env, current_python,
                      findings, is_signal, kinds, run_capsan, summarize, tagged_pythons)


# {NAME: PYTHON}: the venvs of .ci/realworld (make realworld-venvs)
REAL = tagged_pythons("realworld.txt")


def released(name) -> Path:
    if name not in REAL:
        pytest.fail(f"no {name} venv (make realworld-venvs; .ci/realworld)", pytrace=False)
    return REAL[name]


def native(script, py, env=None, args=(), timeout=120):
    return subprocess.run([str(py), str(script), *map(str, args)], capture_output=True, text=True,
                          timeout=timeout, env=base_env(env, py), stdin=subprocess.DEVNULL)


NOGIL = SCENARIOS / "rw_deleter_nogil.py"
REENTER = SCENARIOS / "rw_destructor_reentered.py"


def test_numpy_1_23_deleter_without_gil(tmp_path):
    """numpy 1.23.5's deleter, called by a consumer without the GIL: the
    debug allocator aborts natively; capsan names the delete's line."""
    py = released("numpy-1.23.5")
    cp = native(NOGIL, py, {"PYTHONMALLOC": "debug"})
    assert cp.returncode != 0 and "without holding the GIL" in cp.stderr, cp.stderr[-2000:]
    res = run_capsan(NOGIL, tmp_path, interpreter=py)
    assert res.returncode == 23 and "ok" in res.stdout, res.describe()
    assert_finding_at(res, "dlpack-deleter-no-gil", NOGIL, "nogil-delete", event="call",
                      innermost=False)
    assert kinds(res.report) == {"dlpack-deleter-no-gil"}, summarize(res.report)


def test_numpy_2_deleter_takes_the_gil(tmp_path):
    """The fixed twin: numpy 2's deleter takes the GIL itself."""
    py = current_python("cp311")
    cp = native(NOGIL, py, {"PYTHONMALLOC": "debug"})
    assert cp.returncode == 0 and "ok" in cp.stdout, cp.stderr[-2000:]
    res = run_capsan(NOGIL, tmp_path, interpreter=py)
    assert res.returncode == 0 and findings(res.report) == [], summarize(res.report)


@pytest.mark.parametrize("which", ["numpy-1.23.5", "debian-numpy-1.24.2"])
def test_numpy_destructor_reentered(tmp_path, which):
    """numpy 1.22-2.0's destructor resurrects a capsule it does not know the
    name of: SIGSEGV natively; capsan says dlpack-destructor-reentered at
    the line the capsule died on, before the crash."""
    py = STATIC_PY if which.startswith("debian") else released(which)
    cp = native(REENTER, py)
    assert is_signal(cp.returncode, 11), (cp.returncode, cp.stderr[-1500:])
    res = run_capsan(REENTER, tmp_path, interpreter=py)
    assert res.returncode != 0 and "ok" not in res.stdout, res.describe()
    assert "dlpack-destructor-reentered" in res.stderr, res.stderr[-3000:]
    assert_finding_at(res, "dlpack-destructor-reentered", REENTER, "dies", innermost=False)
    # the consumer's own rename is the cause, said where it happened (R7)
    assert_finding_at(res, "dlpack-bad-tensor", REENTER, "renamed", innermost=False)


def test_numpy_destructor_reentered_protect(tmp_path):
    """protect=1 stops the recursion: the program ends normally."""
    py = released("numpy-1.23.5")
    res = run_capsan(REENTER, tmp_path, interpreter=py, options=["protect=1"])
    assert res.returncode == 23 and "ok" in res.stdout, res.describe()
    assert len(findings(res.report, "dlpack-destructor-reentered")) == 1, summarize(res.report)


def test_numpy_2_destructor_returns(tmp_path):
    """The fixed twin: numpy 2.4 reports the unraisable and returns, no
    recursion. What remains is true: the consumer's rename, and the tensor
    (with its array) that numpy then declines to release."""
    py = current_python("cp311")
    cp = native(REENTER, py)
    assert cp.returncode == 0 and "ok" in cp.stdout, cp.stderr[-2000:]
    res = run_capsan(REENTER, tmp_path, interpreter=py)
    assert res.returncode == 23 and "ok" in res.stdout, res.describe()
    got = kinds(res.report)
    assert "dlpack-bad-tensor" in got and "dlpack-destructor-reentered" not in got, got
    assert got <= {"dlpack-bad-tensor", "dlpack-leak", "numpy-leak"}, summarize(res.report)


VIEW = SCENARIOS / "rw_view_offset.py"


def test_cuda_core_1_1_view_drops_byte_offset(tmp_path):
    """cuda-core 1.1.0's StridedMemoryView re-exports a consumed tensor from
    its data field, byte_offset dropped: numpy reads the wrong elements
    natively; capsan names the re-export's line."""
    py = released("cuda-core-1.1.0")
    cp = native(VIEW, py)
    assert cp.returncode == 0 and "sum 2.0" in cp.stdout, (cp.stdout, cp.stderr[-2000:])
    res = run_capsan(VIEW, tmp_path, interpreter=py)
    assert res.returncode == 23 and "sum 2.0" in res.stdout, res.describe()
    f = assert_finding_at(res, "dlpack-byte-offset-ignored", VIEW, "reexport", event="reexport",
                          innermost=False)
    assert "re-exported" in f["message"] and "byte_offset 16" in f["message"], f["message"]
    assert_finding_at(res, "dlpack-byte-offset-ignored", VIEW, "consume", event="consume",
                      innermost=False)
    assert kinds(res.report) == {"dlpack-byte-offset-ignored"}, summarize(res.report)


def test_cuda_core_1_2_view_keeps_byte_offset(tmp_path):
    """The fixed twin, cuda-core 1.2.2: the view starts at data +
    byte_offset, numpy sums 28.0, and capsan says nothing."""
    py = released("cuda-core-1.2.2")
    cp = native(VIEW, py)
    assert cp.returncode == 0 and "sum 28.0" in cp.stdout, (cp.stdout, cp.stderr[-2000:])
    res = run_capsan(VIEW, tmp_path, interpreter=py)
    assert res.returncode == 0 and findings(res.report) == [], summarize(res.report)


CLOSED = SCENARIOS / "rw_stream_read_after_close.py"


def test_pyarrow_11_reads_a_closed_stream(tmp_path):
    """pyarrow 11.0.0's reader imported by address releases its
    ArrowArrayStream on close() and read_all() still calls get_next through
    it (apache/arrow #34906): SIGSEGV natively; capsan says
    arrow-use-after-release at the read, with the close that released it."""
    py = released("pyarrow-11.0.0")
    cp = native(CLOSED, py)
    assert is_signal(cp.returncode, 11) and "ok" not in cp.stdout, (cp.returncode, cp.stderr[-1500:])
    res = run_capsan(CLOSED, tmp_path, interpreter=py)
    assert res.returncode != 0 and "ok" not in res.stdout, res.describe()
    f = assert_finding_at(res, "arrow-use-after-release", CLOSED, "read", event="get-next",
                          innermost=False)
    # the reader's own released struct, not a stale copy (arrow-adbc #4363's shape)
    assert "get_next of ArrowArrayStream" in f["message"] and "#34906" in f["message"] \
        and "stale copy" not in f["message"], f["message"]
    for tag, event in (("close", "release"), ("import", "import-by-address"),
                       ("export", "export-by-address")):
        assert_finding_at(res, "arrow-use-after-release", CLOSED, tag, event=event, innermost=False)
    assert kinds(res.report) == {"arrow-use-after-release"}, summarize(res.report)


def test_pyarrow_12_refuses_a_closed_stream(tmp_path):
    """The fixed twin, pyarrow 12.0.0 (PR #35016): the closed reader raises
    ArrowInvalid without calling the stream, and capsan says nothing."""
    py = released("pyarrow-12.0.0")
    cp = native(CLOSED, py)
    assert cp.returncode == 0 and "refused" in cp.stdout and "ok" in cp.stdout, cp.stderr[-2000:]
    res = run_capsan(CLOSED, tmp_path, interpreter=py)
    assert res.returncode == 0 and "refused" in res.stdout, res.describe()
    assert findings(res.report) == [], summarize(res.report)


KUZU = SCENARIOS / "rw_schema_release_not_cleared.py"


def scratch(tmp_path):
    """kuzu's database directory goes under the test's own (tempfile reads
    TMPDIR): the aborting run cannot remove it itself."""
    return {"TMPDIR": str(tmp_path)}


def test_kuzu_0_0_8_schema_release_not_cleared(tmp_path):
    """kuzu 0.0.8's ArrowSchema, handed to pyarrow by address in
    get_as_arrow, has a release that returns without clearing release
    (kuzudb/kuzu #2037): pyarrow 13 aborts natively; capsan says
    arrow-release-not-cleared at the get_as_arrow line, naming kuzu's
    module as the producer."""
    py = released("kuzu-0.0.8")
    cp = native(KUZU, py, scratch(tmp_path))
    assert is_signal(cp.returncode, 6) and "did not cleanup release callback" in cp.stderr, \
        (cp.returncode, cp.stderr[-1500:])
    res = run_capsan(KUZU, tmp_path, interpreter=py, env=scratch(tmp_path))
    assert res.returncode != 0 and "ok" not in res.stdout, res.describe()
    f = assert_finding_at(res, "arrow-release-not-cleared", KUZU, "to-arrow", event="release",
                          innermost=False)
    assert f["object"]["type"] == "ArrowSchema", f["object"]
    assert_finding_at(res, "arrow-release-not-cleared", KUZU, "to-arrow",
                      event="import-by-address", innermost=False)
    assert "its producer: _kuzu" in res.stderr, res.stderr[-3000:]
    assert kinds(res.report) == {"arrow-release-not-cleared"}, summarize(res.report)


def test_kuzu_0_0_9_schema_release_clears(tmp_path):
    """The fixed twin, kuzu 0.0.9 with the same pyarrow 13: a schema of
    its own for each batch, released as it should be; capsan says nothing."""
    py = released("kuzu-0.0.9")
    cp = native(KUZU, py, scratch(tmp_path))
    assert cp.returncode == 0 and "rows 3" in cp.stdout and "ok" in cp.stdout, cp.stderr[-2000:]
    res = run_capsan(KUZU, tmp_path, interpreter=py, env=scratch(tmp_path))
    assert res.returncode == 0 and "rows 3" in res.stdout, res.describe()
    assert findings(res.report) == [], summarize(res.report)


TO_DLPACKS = SCENARIOS / "rw_to_dlpacks_lost.py"


def test_onnxruntime_to_dlpacks_loses_a_refused_capsule(tmp_path):
    """onnxruntime 1.23.2's OrtValueVector.to_dlpacks re-arms one capsule
    without a destructor for each tensor (SetName, SetPointer); when its
    callback raises it throws and never drops the capsule: the tensor it
    holds, and its buffer, are never released. Natively the program only
    sees a RuntimeError; capsan says dlpack-leak at the to_dlpacks line."""
    py = released("onnxruntime-1.23.2")
    cp = native(TO_DLPACKS, py, args=["fail"])
    assert cp.returncode == 0 and "refused" in cp.stdout and "ok" in cp.stdout, cp.stderr[-2000:]
    res = run_capsan(TO_DLPACKS, tmp_path, interpreter=py, args=["fail"])
    assert "refused: to_tensor returned a null pointer" in res.stdout and "ok" in res.stdout, \
        res.describe()
    assert res.returncode == 23, res.describe()
    # the re-arm inside to_dlpacks, called from the script's line itself
    f = assert_finding_at(res, "dlpack-leak", TO_DLPACKS, "to-dlpacks", event="export")
    assert f["severity"] == "error", f
    assert kinds(res.report) == {"dlpack-leak"}, summarize(res.report)
    assert len(findings(res.report, "dlpack-leak")) == 1, summarize(res.report)


def test_onnxruntime_to_dlpacks_callback_takes_all(tmp_path):
    """The silent twin (no release fixes it; 1.32.0 still leaks): the same
    release, its callback consuming all three tensors. Each re-armed
    capsule is a loan capsan follows (3 tensors), and nothing leaks."""
    py = released("onnxruntime-1.23.2")
    res = run_capsan(TO_DLPACKS, tmp_path, interpreter=py, args=["ok"])
    assert res.returncode == 0 and "sums [6.0, 10.0, 15.0]" in res.stdout, res.describe()
    assert findings(res.report) == [], summarize(res.report)
    assert "3 tensors" in res.stderr, res.stderr[-2000:]


WARP = SCENARIOS / "rw_warp_offset.py"


def test_warp_1_19_from_dlpack_drops_byte_offset(tmp_path):
    """warp-lang 1.19.0's from_dlpack makes its array from data alone:
    natively the array sums 2.0, not 28.0; capsan sees the array's
    __array_interface__ start at data and says dlpack-byte-offset-ignored
    at the from_dlpack line."""
    py = released("warp-lang-1.19.0")
    env = {"TMPDIR": str(tmp_path)}
    cp = native(WARP, py, env, args=["warp"])
    assert cp.returncode == 0 and "sum 2.0" in cp.stdout, (cp.stdout, cp.stderr[-2000:])
    res = run_capsan(WARP, tmp_path, interpreter=py, args=["warp"], env=env)
    assert res.returncode == 23 and "sum 2.0" in res.stdout, res.describe()
    f = assert_finding_at(res, "dlpack-byte-offset-ignored", WARP, "consume", event="consume",
                          innermost=False)
    assert "__array_interface__" in f["message"] and "byte_offset 16" in f["message"], \
        f["message"]
    assert kinds(res.report) == {"dlpack-byte-offset-ignored"}, summarize(res.report)
    assert len(findings(res.report)) == 1, summarize(res.report)


def test_warp_wraps_what_numpy_consumed(tmp_path):
    """The silent twin (no warp release honors byte_offset): numpy's
    from_dlpack consumes the same tensor in the same venv, warp wraps
    numpy's array, both start at the first element: 28.0, nothing said."""
    py = released("warp-lang-1.19.0")
    env = {"TMPDIR": str(tmp_path)}
    res = run_capsan(WARP, tmp_path, interpreter=py, args=["numpy"], env=env)
    assert res.returncode == 0 and "sum 28.0" in res.stdout, res.describe()
FFI_LOST = SCENARIOS / "rw_ffi_error_lost.py"
REFUSED = {"kernel": "refused TypeError", "callback": "refused ValueError"}


@pytest.fixture(scope="module")
def kernel_build(tmp_path_factory):
    """load_inline's build directory for a release: its kernel is compiled
    once, by the first run, and reused by the others."""
    dirs = {}

    def get(name):
        if name not in dirs:
            dirs[name] = tmp_path_factory.mktemp(name)
        return dirs[name]

    return get


@pytest.mark.parametrize("mode", ["kernel", "callback"])
def test_tvm_ffi_0_1_8_post1_error_lost(tmp_path, kernel_build, mode):
    """apache-tvm-ffi 0.1.8.post1 with torch 2.13.0: a call whose torch
    argument came through torch's exchange table fails (a load_inline
    kernel's TypeError, a registered Python function's ValueError), and the
    binding's allocator restore stores its own return code over the
    call's: the call returns None natively, no exception. The program
    makes no other tvm-ffi call; capsan says dlpack-exchange-contract at
    the call's line when the process ends."""
    name = "tvm-ffi-0.1.8.post1"
    py = released(name)
    args = [mode, kernel_build(name)]
    cp = native(FFI_LOST, py, args=args, timeout=600)
    assert cp.returncode == 0 and "lost None" in cp.stdout and "ok" in cp.stdout, \
        (cp.stdout, cp.stderr[-2000:])
    res = run_capsan(FFI_LOST, tmp_path, args=args, interpreter=py, timeout=600)
    assert res.returncode == 23 and "lost None" in res.stdout and "ok" in res.stdout, \
        res.describe()
    f = assert_finding_at(res, "dlpack-exchange-contract", FFI_LOST, "call", event="exchange-call")
    assert "TVMFFIFunctionCall" in f["message"] and "without fetching" in f["message"], \
        f["message"]
    assert len(findings(res.report)) == 1, summarize(res.report)


@pytest.mark.parametrize("mode", ["kernel", "callback"])
def test_tvm_ffi_0_1_8_post2_error_raised(tmp_path, kernel_build, mode):
    """The fixed twin, apache-tvm-ffi 0.1.8.post2 with the same torch: the
    call's return code is kept, its error fetched and raised; the program
    sees the exception, and capsan says nothing."""
    name = "tvm-ffi-0.1.8.post2"
    py = released(name)
    args = [mode, kernel_build(name)]
    cp = native(FFI_LOST, py, args=args, timeout=600)
    assert cp.returncode == 0 and REFUSED[mode] in cp.stdout and "ok" in cp.stdout, \
        (cp.stdout, cp.stderr[-2000:])
    res = run_capsan(FFI_LOST, tmp_path, args=args, interpreter=py, timeout=600)
    assert res.returncode == 0 and REFUSED[mode] in res.stdout and "ok" in res.stdout, \
        res.describe()
    assert findings(res.report) == [], summarize(res.report)
