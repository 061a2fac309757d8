"""Upstream DLPack suites under capsan (`make check-upstream`,
CAPSAN_CHECK_UPSTREAM=1; `make test` skips them): the projects' own tests, at
the exact release the venv has, must pass and capsan must report nothing.

- torch 2.13.0's test/test_dlpack.py (the cp311 venv; torch's wheel ships the
  torch.testing._internal it imports, not the test, which is obtained at the
  wheel's own commit, torch.version.git_version; expecttest, which
  common_utils imports, pinned into a cache);
- JAX 0.10.2's tests/array_interoperability_test.py and
  tests/pytorch_interoperability_test.py (JAX <-> NumPy and JAX <-> torch
  DLPack), with absl-py, which they import, pinned into a cache;
- tvm-ffi 0.1.15.post2's DLPack tests, from its pinned sdist: the exchange
  API against torch (test_dlpack_exchange_api.py builds a torch C++
  extension; test_optional_torch_c_dlpack.py builds tvm-ffi's own
  torch_c_dlpack addon, in subprocesses), containers and tensors;
- pyarrow 26.0.1's pyarrow/tests/test_dlpack.py, as its wheel ships it, in a
  private venv of the cp311 base interpreter (pyarrow + numpy 2.4.6 +
  pytest, and hypothesis, which pyarrow's conftest imports; pinned below);
- numpy 2's test_dlpack.py is test_numpy_suites.py's (make check-numpy);
  its test_numeric.py (arrays pytest's items hold to the end: held, not
  leaked) is here, under `capsan run`;
- the Arrow peers' suites (issue 37), in the Arrow cp311 venv: pyarrow's and
  pandas' PyCapsule tests as their wheels ship them, and nanoarrow's,
  arro3-core's, duckdb's and polars' from the stored git snapshots at a
  pinned commit (not the releases' own: the snapshots lack those tags; see
  upstream_sources.py). Three true findings, listed in docs/findings.md,
  are asserted under `capsan run` and suppressed in the plugin's runs.

Where the files come from: upstream_sources.py (nothing vendored).

Every suite runs three times: under `capsan run` (global tracking, the
whole process tree), with the pytest plugin on a preloaded runtime
(--capsan: every test its own trace window with a tracing NumPy handler, so
a block a test leaves alive is a numpy-leak of that test), and with the
plugin alone, as a user's `pytest --capsan` starts it: late, after pytest
and the suite's modules are loaded (issue 36). That late run must count
exactly what the suite counts natively, run beside it. The DLPack suites have no true finding: every assertion
below is "no finding", in both modes, and the runs are checked to have
watched real exchanges (tensors counted), so an empty report is not a
sanitizer that saw nothing.

Known-unrelated outcomes, none a failure: GPU/ROCm/CUDA-only cases, and
TensorFlow and CuPy cases (not installed), skip; JAX's x64 cases skip unless
JAX_ENABLE_X64 (the `capsan run` pass sets it, and asks for every generated
case, JAX_NUM_GENERATED_CASES, instead of JAX's default sample of 10).
"""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import (CAPSAN, LIBCAPSAN, SCENARIOS, base_env, capsan_report, current_python,
                      no_core, require, summarize, tagged_pythons, trace_files)

sys.path.insert(0, str(SCENARIOS))
from np_testlib import PYDIR  # noqa: E402
import upstream_sources as us  # noqa: E402

pytestmark = pytest.mark.skipif(os.environ.get("CAPSAN_CHECK_UPSTREAM") != "1",
                                reason="upstream suites: run by `make check-upstream`")

ABSL = "absl-py==2.5.1"
EXPECTTEST = "expecttest==0.3.0"   # torch.testing._internal.common_utils imports it
PYARROW_PINS = ("pyarrow==26.0.1", "numpy==2.4.6", "pytest==9.2.0", "hypothesis==6.170.17")
PRIVATE_VENVS = Path(os.environ.get("CAPSAN_UPSTREAM_VENVS")
                     or Path.home() / ".cache" / "capsan" / "upstream-venvs")


def venv_python():
    return current_python("cp311")


def installed_version(py, dist):
    cp = subprocess.run([str(py), "-c", f"import importlib.metadata as m; print(m.version({dist!r}))"],
                        capture_output=True, text=True, timeout=120, env=base_env())
    return cp.stdout.strip() if cp.returncode == 0 else None


def upstream_files(up: us.Upstream, py, tmp_path) -> Path:
    """A copy, in tmp_path, of the suite's files (the suites write next to
    themselves: tvm-ffi's build output), after checking the venv has
    exactly up.version."""
    got = installed_version(py, up.dist)
    assert got == up.version, (f"{py} has {up.dist} {got}; upstream_sources pins {up.version} "
                               "(update the pin, its commit and the test file together)")
    try:
        src = us.obtain(up, py)
    except us.Unavailable as e:
        src, msg = None, str(e)
    if src is None:
        pytest.fail(msg, pytrace=False)
    return Path(shutil.copytree(src, tmp_path / "src"))


def pip_target(py, req, name) -> Path:
    """A folder with `req` installed for `py` (pip --target), made once."""
    d = us.CACHE / "deps" / name
    if not (d / ".done").exists():
        subprocess.run(["rm", "-rf", str(d)], check=True)
        cp = subprocess.run([str(py), "-m", "pip", "install", "-q", "--disable-pip-version-check",
                             "--target", str(d), req], capture_output=True, text=True, timeout=600)
        assert cp.returncode == 0, f"pip could not install {req} into {d}:\n{cp.stderr}"
        (d / ".done").write_text(req + "\n")
    return d


def pyarrow_python() -> Path:
    """A private venv of the cp311 venv's base CPython with PYARROW_PINS,
    rebuilt when the pins change."""
    home = next(line.split("=", 1)[1].strip()
                for line in (venv_python().parent.parent / "pyvenv.cfg").read_text().splitlines()
                if line.startswith("home"))
    base = Path(home) / "python3.11"
    require(base)
    d = PRIVATE_VENVS / ("-".join(p.replace("==", "-") for p in PYARROW_PINS[:1]) + "-cp311")
    stamp = d / "capsan-pins.txt"
    want = "\n".join(PYARROW_PINS) + "\n"
    if not (stamp.exists() and stamp.read_text() == want):
        subprocess.run(["rm", "-rf", str(d)], check=True)
        subprocess.run([str(base), "-m", "venv", str(d)], check=True, timeout=300)
        cp = subprocess.run([str(d / "bin" / "python"), "-m", "pip", "install", "-q",
                             "--disable-pip-version-check", *PYARROW_PINS],
                            capture_output=True, text=True, timeout=1200)
        assert cp.returncode == 0, f"pip install {' '.join(PYARROW_PINS)} failed:\n{cp.stderr}"
        stamp.write_text(want)
    return d / "bin" / "python"


def run_suite(tmp_path, py, files, *, mode, cwd, pythonpath=(), env=None, timeout=1800,
              options=()):
    """pytest on `files` (and any pytest arguments after them) with `py`
    under capsan (CAPSAN_OPTIONS `options` added). mode "run": `capsan run`;
    "plugin": LD_PRELOAD + `-p capsan.pytest_plugin --capsan`;
    "late": `-p capsan.pytest_plugin --capsan` alone (the plugin starts the
    runtime: a late start); "native": no capsan. Returns
    (CompletedProcess, trace report, plugin report or None)."""
    require(CAPSAN, LIBCAPSAN, PYDIR / "capsan" / "__init__.py")
    e = base_env(None, py)
    e["PYTHONPATH"] = ":".join(map(str, [PYDIR, *pythonpath]))
    e.update(env or {})
    log = tmp_path / "t"
    args = ["-m", "pytest", "-p", "no:cacheprovider", "-q", "-rfEs", *map(str, files)]
    out = tmp_path / "capsan.json"
    if mode in ("plugin", "late"):
        if mode == "plugin":
            e["LD_PRELOAD"] = str(LIBCAPSAN)
        else:  # the same plugins as natively (autoload off in both)
            e["PYTEST_DISABLE_PLUGIN_AUTOLOAD"] = "1"
        # keep_trace=always: a clean run's trace is read here too (what it watched)
        e["CAPSAN_OPTIONS"] = ":".join([f"log_path={log}", "exitcode=0", "keep_trace=always",
                                        *options])
        cmd = [str(py), *args, "-p", "capsan.pytest_plugin", "--capsan", f"--capsan-report={out}"]
    elif mode == "native":
        e["PYTEST_DISABLE_PLUGIN_AUTOLOAD"] = "1"
        cmd = [str(py), *args]
    else:
        e["PYTEST_DISABLE_PLUGIN_AUTOLOAD"] = "1"
        if options:
            e["CAPSAN_OPTIONS"] = ":".join(options)
        cmd = [str(CAPSAN), "run", "--keep-trace", "--log-path", str(log), "--", str(py), *args]
    cp = subprocess.run(cmd, capture_output=True, text=True, env=e, timeout=timeout, cwd=str(cwd),
                        stdin=subprocess.DEVNULL, preexec_fn=no_core)
    traces = trace_files(tmp_path)
    report = capsan_report(traces)[1] if traces else None
    cp.describe = (f"command: {' '.join(cmd)}\ncwd: {cwd}\nrc={cp.returncode}\n--- stdout\n"
                   f"{cp.stdout[-6000:]}\n--- stderr\n{cp.stderr[-4000:]}\n--- trace findings\n"
                   f"{summarize(report)}")
    plugin = json.loads(out.read_text()) if mode in ("plugin", "late") and out.exists() else None
    return cp, report, plugin


def counts(stdout):
    """{"passed": N, "failed": N, ...} from pytest's summary line."""
    last = [line for line in stdout.splitlines() if re.search(r"\d+ (passed|failed)", line)]
    assert last, "no pytest summary line"
    return {k: int(n) for n, k in re.findall(r"(\d+) (\w+)", last[-1])}


def check_clean(cp, report, plugin, *, min_passed, min_tensors, mode, true=(), min_arrow=0,
                min_blocks=0):
    """The suite passed (failures none, errors none), capsan found nothing,
    and it watched real traffic: at least 3 * `min_tensors` events (a tensor
    is made, consumed and released), and
    (capsan run's exit line) `min_tensors` DLPack tensors, `min_blocks` NumPy
    blocks and `min_arrow` Arrow structs."""
    assert cp.returncode == 0, cp.describe
    c = counts(cp.stdout)
    assert c.get("passed", 0) >= min_passed and not c.get("failed") and not c.get("error"), (
        f"{c}\n{cp.describe}")
    assert report is not None, cp.describe
    findings = [f for p in report["processes"] for f in p["findings"] if f not in true]
    assert findings == [], "capsan reported findings on an upstream suite\n" + cp.describe
    events = sum(p["summary"]["events"] for p in report["processes"])
    assert events >= 3 * min_tensors, f"only {events} events traced\n{cp.describe}"
    if mode == "run":
        m = re.search(r"capsan: no findings: (\d+) process\w* traced, (\d+) tensor", cp.stderr)
        assert m, "capsan run did not say what it watched\n" + cp.describe
        assert int(m.group(2)) >= min_tensors, f"only {m.group(2)} tensors\n{cp.describe}"
        w = re.search(r"tensors?, (\d+) NumPy blocks? and (\d+) Arrow struct", cp.stderr)
        assert w, "capsan run did not say what it watched\n" + cp.describe
        assert int(w.group(1)) >= min_blocks, f"only {w.group(1)} NumPy blocks\n{cp.describe}"
        assert int(w.group(2)) >= min_arrow, f"only {w.group(2)} Arrow structs\n{cp.describe}"
    if plugin is not None:
        assert len(plugin["tests"]) >= min_passed, cp.describe
        bad = {t["nodeid"]: t["findings"] for t in plugin["tests"] if t["findings"]}
        assert not bad, f"tests with findings: {sorted(bad)}\n{cp.describe}"
        assert plugin["outside_tests"] == [], cp.describe
    return c


MODES = ["run", "plugin", "late"]


def same_as_native(tmp_path, py, files, c, **kw):
    """A late start changes nothing: the suite's counts natively, beside it."""
    (tmp_path / "native").mkdir(exist_ok=True)
    ncp, _, _ = run_suite(tmp_path / "native", py, files, mode="native", **kw)
    assert c == counts(ncp.stdout), (f"late start {c} != native {counts(ncp.stdout)}\n"
                                     + ncp.stdout[-3000:])


@pytest.mark.parametrize("mode", MODES)
def test_torch_test_dlpack(tmp_path, mode):
    """torch's own DLPack suite: capsule and protocol round trips of every
    dtype, versioned and 0.x capsules, non-contiguous and strided views,
    NumPy <-> torch, and the export errors (requires_grad, conj, sparse,
    quantized, bad stream, bad device): each error path must leave no
    capsule or tensor behind."""
    py = venv_python()
    d = upstream_files(us.TORCH, py, tmp_path)
    deps = pip_target(py, EXPECTTEST, "expecttest-cp311")
    files = [d / "test" / "test_dlpack.py"]
    cp, report, plugin = run_suite(tmp_path, py, files, mode=mode, cwd=d / "test",
                                   pythonpath=[deps])
    c = check_clean(cp, report, plugin, min_passed=100, min_tensors=100, mode=mode)
    if mode == "late":
        same_as_native(tmp_path, py, files, c, cwd=d / "test", pythonpath=[deps])


@pytest.mark.parametrize("mode", MODES)
def test_jax_interoperability(tmp_path, mode):
    """JAX's DLPack interoperability tests against NumPy and torch, CPU
    only (the GPU, TensorFlow and CuPy cases skip)."""
    py = venv_python()
    d = upstream_files(us.JAX, py, tmp_path)
    absl = pip_target(py, ABSL, "absl-cp311")
    env = {"JAX_PLATFORMS": "cpu"}
    if mode == "run":
        env.update(JAX_ENABLE_X64="1", JAX_NUM_GENERATED_CASES="1000")
    files = [d / p for p in us.JAX.paths]
    cp, report, plugin = run_suite(tmp_path, py, files, mode=mode, cwd=d / "tests",
                                   pythonpath=[absl], env=env)
    c = check_clean(cp, report, plugin, min_passed=60, min_tensors=100, mode=mode)
    if mode == "late":
        same_as_native(tmp_path, py, files, c, cwd=d / "tests", pythonpath=[absl], env=env)
    if mode == "run":
        assert c["passed"] >= 1000, f"x64 and every generated case: {c}\n{cp.describe}"


WRAPPER = "tvm_ffi.core:DLTensorTestWrapper"


@pytest.mark.parametrize("mode", MODES)
def test_tvm_ffi_dlpack(tmp_path, mode):
    """tvm-ffi's DLPack tests: the DLPack exchange API (a C++ consumer
    against torch's), containers converted through DLPack, the optional
    torch_c_dlpack addon (built and loaded in subprocesses), and
    tvm_ffi.Tensor <-> torch/NumPy.

    No finding, in either mode. tvm_ffi.core.DLTensorTestWrapper (a
    wrapper tvm-ffi ships in its core module "only for testing purpose",
    python/tvm_ffi/cython/tensor.pxi) offers a DLPackExchangeAPI table
    whose managed_tensor_allocator is NULL, where the DLPack 1.3 header
    says "This function must not be NULL" (R50). capsan judges a table
    when a consumer reads its capsule or first calls through it, and
    nothing here uses that one: capsan.start() follows the tables of the
    loaded types (the plugin's mode) without judging them. The table is
    looked up at the session's end (-p xapi_tables) to show it is there."""
    py = venv_python()
    d = upstream_files(us.TVM_FFI, py, tmp_path) / "tests" / "python"
    files = [d / Path(p).name for p in us.TVM_FFI.paths]
    tables = tmp_path / "tables.json"
    env = {"CAPSAN_XAPI_TYPES": WRAPPER, "CAPSAN_XAPI_OUT": str(tables)}
    extra = ["-p", "xapi_tables"] if mode == "plugin" else []
    cp, report, plugin = run_suite(tmp_path, py, [*files, *extra], mode=mode, cwd=d,
                                   pythonpath=[SCENARIOS], env=env)
    if mode == "plugin" and report is not None:
        addr = json.loads(tables.read_text())[WRAPPER] if tables.exists() else None
        assert addr, "DLTensorTestWrapper has no exchange table?\n" + cp.describe
    c = check_clean(cp, report, plugin, min_passed=25, min_tensors=20, mode=mode)
    if mode == "late":
        same_as_native(tmp_path, py, files, c, cwd=d, pythonpath=[SCENARIOS], env=env)


@pytest.mark.parametrize("mode", MODES)
def test_pyarrow_test_dlpack(tmp_path, mode):
    """pyarrow's test_dlpack.py as the wheel ships it: Arrow arrays and
    tensors exported to NumPy through DLPack, versioned and 0.x, every
    numeric type, slices, empty arrays, and the unsupported cases raising."""
    py = pyarrow_python()
    cp = subprocess.run([str(py), "-c", "import pyarrow, os; print(os.path.dirname(pyarrow.__file__))"],
                        capture_output=True, text=True, timeout=120, env=base_env())
    assert cp.returncode == 0, cp.stderr
    test = Path(cp.stdout.strip()) / "tests" / "test_dlpack.py"
    assert test.exists(), f"the pyarrow wheel has no {test}"
    cp, report, plugin = run_suite(tmp_path, py, [test], mode=mode, cwd=tmp_path)
    c = check_clean(cp, report, plugin, min_passed=140, min_tensors=100, mode=mode)
    if mode == "late":
        same_as_native(tmp_path, py, [test], c, cwd=tmp_path)


# ---- the Arrow peers' suites (issue 37): the test files the wheels ship,
# in the pinned Arrow venv (.ci/arrowvenvs, make arrow-venvs), whose pins
# upstream_files-like checks below compare with the installed versions

ARROW_VENVS = tagged_pythons("arrowvenvs.txt")
ARROW_PINS = {"pyarrow": "26.0.1", "pandas": "3.1.1"}


def arrow_python(dists):
    py = ARROW_VENVS.get("cp311")
    if py is None:
        pytest.skip("no Arrow cp311 venv (make arrow-venvs; .ci/arrowvenvs)")
    for dist in dists:
        got = installed_version(py, dist)
        assert got == ARROW_PINS[dist], (f"{py} has {dist} {got}; this suite pins "
                                         f"{ARROW_PINS[dist]} (.ci/arrowvenvs and ARROW_PINS together)")
    return py


def site_dir(py, module) -> Path:
    cp = subprocess.run([str(py), "-c", f"import {module}, os; print(os.path.dirname({module}.__file__))"],
                        capture_output=True, text=True, timeout=120, env=base_env())
    assert cp.returncode == 0, cp.stderr
    return Path(cp.stdout.strip())


# pyarrow's own tests of the PyCapsule interface: __arrow_c_schema__,
# __arrow_c_array__, __arrow_c_stream__ and their imports, of arrays,
# chunked arrays, record batches, tables, types, fields and schemas, and
# the C data interface through cffi: 28 tests with pyarrow 26.0.1 (its
# test_cffi.py's capsule round trips among them; the whole file, structs
# by address and its two true leaks, runs in make test:
# test_arrow_byaddr.py::test_pyarrow_test_cffi_clean)
PYARROW_CAPSULE_K = "c_array or c_stream or c_schema or capsule"


@pytest.mark.parametrize("mode", MODES)
def test_pyarrow_capsule_interface(tmp_path, mode):
    py = arrow_python(["pyarrow"])
    t = site_dir(py, "pyarrow") / "tests"
    files = [t / "test_array.py", t / "test_table.py", t / "test_types.py", t / "test_cffi.py",
             "-k", PYARROW_CAPSULE_K]
    cp, report, plugin = run_suite(tmp_path, py, files, mode=mode, cwd=tmp_path)
    c = check_clean(cp, report, plugin, min_passed=28, min_tensors=0, mode=mode, min_arrow=100)
    if mode == "late":
        same_as_native(tmp_path, py, files, c, cwd=tmp_path)


@pytest.mark.parametrize("mode", MODES)
def test_pandas_arrow_interface(tmp_path, mode):
    """pandas' tests of the Arrow PyCapsule interface (DataFrame and Series
    __arrow_c_stream__ / from_arrow) and of the dataframe interchange
    protocol, as the wheel ships them."""
    py = arrow_python(["pandas", "pyarrow"])
    t = site_dir(py, "pandas") / "tests"
    files = [t / "series" / "test_arrow_interface.py", t / "frame" / "test_arrow_interface.py",
             t / "interchange"]
    cp, report, plugin = run_suite(tmp_path, py, files, mode=mode, cwd=tmp_path)
    c = check_clean(cp, report, plugin, min_passed=150, min_tensors=0, mode=mode, min_arrow=40)
    if mode == "late":
        same_as_native(tmp_path, py, files, c, cwd=tmp_path)


def test_numpy_test_numeric_under_capsan_run(tmp_path):
    """numpy 2's test_numeric.py (the cp311 venv's wheel): a test class
    whose setup keeps arrays on self, and arrays made at collection as
    parametrize values, which pytest's items hold to the end of the session
    and past finalization. They are held, not leaked (issue 37 path 8: 42
    numpy-leak errors before)."""
    py = venv_python()
    tests = site_dir(py, "numpy") / "_core" / "tests"
    from test_numpy_suites import hypothesis_path
    deps = [d for d in [hypothesis_path(py, "cp311")] if d]
    cp, report, plugin = run_suite(tmp_path, py, [tests / "test_numeric.py"], mode="run",
                                   cwd=tmp_path, pythonpath=deps)
    check_clean(cp, report, plugin, min_passed=1000, min_tensors=0, mode="run", min_blocks=10000)


def at(finding, kind, where):
    """finding is a `kind` one with a Python frame at `where` (FILE:LINE or
    FILE's name alone) in one of its events"""
    if finding["kind"] != kind:
        return False
    for ev in finding["events"]:
        for fr in ev["stack"]:
            if fr.get("python") and (f"{Path(fr['file']).name}:{fr['line']}" == where
                                     or Path(fr["file"]).name == where):
                return True
    return False


# nanoarrow's true finding (docs/findings.md, "Peers' own test suites"):
# (kind, where, suppression): a reference nanoarrow 0.9.0 loses when
# c_array() refuses a 2-d buffer (proven natively: sys.getrefcount grows by
# one per refused call). The placeholder schema c_array(bare capsule) reads
# back is nanoarrow's own: no finding (test_arrow_peers.py)
NANOARROW_TRUE = (("numpy-leak", "test_c_array.py:335", "numpy-leak:test_c_array_from_iterable_bytes"),)


@pytest.mark.parametrize("mode", MODES)
def test_nanoarrow_suite(tmp_path, mode):
    """nanoarrow's python/tests (schemas, arrays, streams, buffers, capsules,
    DLPack, IPC): the true finding above and nothing else. Under
    `capsan run` they are reported; the plugin's runs suppress them (each
    would fail its test)."""
    py = arrow_python([])
    d = upstream_files(us.NANOARROW, py, tmp_path) / "python" / "tests"
    files = [d]
    if mode == "run":
        # the true findings' errors would set the exit status
        cp, report, plugin = run_suite(tmp_path, py, files, mode=mode, cwd=d,
                                       options=["exitcode=0"])
        fs = [f for p in report["processes"] for f in p["findings"]] if report else []
        for kind, where, _ in NANOARROW_TRUE:
            assert [f for f in fs if at(f, kind, where)], f"no {kind} at {where}\n{cp.describe}"
        true = [f for f in fs if any(at(f, k, w) for k, w, _ in NANOARROW_TRUE)]
        assert len(true) == len(NANOARROW_TRUE), cp.describe
        check_clean(cp, report, plugin, min_passed=250, min_tensors=0, mode="plugin",
                    min_arrow=0, true=true)
        return
    supp = tmp_path / "supp.txt"
    supp.write_text("".join(s + "\n" for _, _, s in NANOARROW_TRUE))
    cp, report, plugin = run_suite(tmp_path, py, files, mode=mode, cwd=d,
                                   options=[f"suppressions={supp}"])
    c = check_clean(cp, report, plugin, min_passed=250, min_tensors=0, mode=mode)
    if mode == "late":
        same_as_native(tmp_path, py, files, c, cwd=d)


@pytest.mark.parametrize("mode", MODES)
def test_arro3_core_suite(tmp_path, mode):
    """arro3-core's tests/core (arrays, chunked arrays, record batches and
    readers, schemas, fields, types, scalars, the FFI and NumPy), the two
    files that need arro3.compute or geoarrow (not installed) left out."""
    py = arrow_python([])
    d = upstream_files(us.ARRO3, py, tmp_path) / "tests" / "core"
    files = [d, f"--ignore={d / 'test_buffer_protocol.py'}", f"--ignore={d / 'test_table.py'}"]
    cp, report, plugin = run_suite(tmp_path, py, files, mode=mode, cwd=d)
    c = check_clean(cp, report, plugin, min_passed=100, min_tensors=0, mode=mode, min_arrow=300)
    if mode == "late":
        same_as_native(tmp_path, py, files, c, cwd=d)


# duckdb's true finding: its test re-executes a relation over a consumed
# stream capsule on purpose, and duckdb refuses it ("already consumed")
DUCKDB_TRUE = ("arrow-reconsume", "test_arrow_pycapsule.py:150",
               "arrow-reconsume:test_pycapsule_rescan_error_type")
# fails natively with 2.0.1 (an attribute the snapshot's test expects)
DUCKDB_NATIVE_FAIL = "test_capsule_slow_path_after_execute"


@pytest.mark.parametrize("mode", MODES)
def test_duckdb_pycapsule_suite(tmp_path, mode):
    """duckdb's test_arrow_pycapsule.py: scans of __arrow_c_stream__
    objects and capsules, the export of relations, and the re-scan of a
    consumed capsule, which is the one true finding (arrow-reconsume, whose
    advice names the second hand-over: duckdb checks and raises)."""
    py = arrow_python([])
    d = upstream_files(us.DUCKDB, py, tmp_path) / "tests"
    test = d / "fast" / "arrow" / "test_arrow_pycapsule.py"
    files = [test, "-k", f"not {DUCKDB_NATIVE_FAIL}"]
    kind, where, supp_line = DUCKDB_TRUE
    if mode == "run":
        cp, report, plugin = run_suite(tmp_path, py, files, mode=mode, cwd=d,
                                       options=["exitcode=0"])
        fs = [f for p in report["processes"] for f in p["findings"]] if report else []
        true = [f for f in fs if at(f, kind, where)]
        assert len(true) == 1, cp.describe
        assert "handed to a consumer again" in true[0]["message"], true[0]["message"]
        check_clean(cp, report, plugin, min_passed=8, min_tensors=0, mode="plugin", true=true)
        return
    supp = tmp_path / "supp.txt"
    supp.write_text(supp_line + "\n")
    cp, report, plugin = run_suite(tmp_path, py, files, mode=mode, cwd=d,
                                   options=[f"suppressions={supp}"])
    c = check_clean(cp, report, plugin, min_passed=8, min_tensors=0, mode=mode)
    if mode == "late":
        same_as_native(tmp_path, py, files, c, cwd=d)


# the snapshot's interop tests that fail natively against polars 2.1.0
# (its API moved on: map types, extension metadata, a fixture renamed)
POLARS_NATIVE_FAIL = ("test_from_arrow_with_bigquery_metadata", "test_from_pyarrow_map",
                      "test_from_pyarrow_map_preserves_nulls_28652",
                      "test_arrow_roundtrip_lex_cat_20288",
                      "test_from_arrow_map_containing_timestamp_23658",
                      "test_schema_constructor_from_schema_capsule", "test_from_arrow_capsule_24511",
                      "test_compat_level", "test_month_day_nano_from_ffi_15969")


@pytest.mark.parametrize("mode", MODES)
def test_polars_interop_suite(tmp_path, mode):
    """polars' interop tests: from_arrow/to_arrow, __arrow_c_stream__ and
    schema capsules both ways, and a stream whose producer fails."""
    py = arrow_python([])
    d = upstream_files(us.POLARS, py, tmp_path) / "py-polars"
    t = d / "tests" / "unit" / "interop"
    files = [t / "test_interop.py", t / "test_arrow_stream_error.py",
             "-k", " and ".join(f"not {n}" for n in POLARS_NATIVE_FAIL)]
    cp, report, plugin = run_suite(tmp_path, py, files, mode=mode, cwd=d)
    c = check_clean(cp, report, plugin, min_passed=60, min_tensors=0, mode=mode, min_arrow=200)
    if mode == "late":
        same_as_native(tmp_path, py, files, c, cwd=d)
