"""The newest CPythons (issue 43): 3.14 and 3.15 (Debian unstable's
packages, in a chroot of their own with capsan built there) and the
free-threaded 3.13t (built from source), as a user meets capsan on them:
`capsan run`, a late `import capsan`, `pytest --capsan`, the stdlib's own
tests after a late start, numpy's DLPack and NEP 49 suites, and correct
traffic among numpy, pyarrow and polars with threads and fork.

capsan reads these interpreters' frames from the layout they publish
themselves (_Py_DebugOffsets): before that, 3.14 and 3.15 had no Python
lines and a false numpy-leak in every NumPy program, and every exit on
3.13t crashed in the roots walk (its object head is 16 bytes longer)."""
import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from conftest import (NEWEST_TAGS, ROOT, SCENARIOS, TESTS, Result, base_env, capsan_report,
                      findings, kinds, marker_line, newest_python, no_core, run_newest,
                      summarize, trace_files)

EXAMPLE = ROOT / "examples" / "double_delete.py"
CLEAN = SCENARIOS / "clean_newest.py"


def line_of(path: Path, text: str) -> int:
    hits = [i for i, s in enumerate(path.read_text().splitlines(), 1) if text in s]
    assert len(hits) == 1, (text, hits)
    return hits[0]


def gil_stayed_off(n, res):
    """On a free-threaded build the program really ran without the GIL: a
    module that does not declare Py_mod_gil would have turned it on."""
    if n.free_threaded:
        assert "gil=False" in res.stdout, res.describe()
        assert "global interpreter lock (GIL) has been enabled" not in res.stderr, res.describe()


@pytest.mark.parametrize("tag", NEWEST_TAGS)
def test_import_numpy_reports_nothing(tmp_path, tag):
    """Once a false numpy-leak on 3.14/3.15: numpy's import-time blocks are
    module data, which needs the frames that tell an import."""
    n = newest_python(tag)
    res = run_newest(n, "import numpy as np\nprint(np.ones(10).sum())\n", tmp_path)
    assert res.returncode == 0 and "10.0" in res.stdout, res.describe()
    assert findings(res.report) == [], res.describe()
    p = res.report["processes"][0]
    assert p["summary"]["events"] > 20, p["summary"]  # numpy's blocks were watched
    assert "layout of CPython" not in res.stderr, res.describe()


@pytest.mark.parametrize("tag", NEWEST_TAGS)
def test_demo_names_its_python_lines(tmp_path, tag):
    """`make demo`'s program: the export, the consume and both deleter
    calls at their Python lines."""
    n = newest_python(tag)
    res = run_newest(n, EXAMPLE, tmp_path, options=["protect=1"])
    assert res.returncode == 23, res.describe()
    assert kinds(res.report) == {"dlpack-double-delete"}, summarize(res.report)
    f = findings(res.report, "dlpack-double-delete")[0]
    lines = {(ev["event"], fr["line"]) for ev in f["events"] for fr in ev["stack"]
             if fr.get("python") and Path(fr["file"]).name == EXAMPLE.name}
    export = line_of(EXAMPLE, "return dlproducer.good(n)")
    consume = line_of(EXAMPLE, "return dlconsumer.double_delete(capsule)")
    assert ("export", export) in lines, (lines, res.describe())
    assert ("consume", consume) in lines, (lines, res.describe())
    assert "consume" in res.stderr and f"{EXAMPLE.name}:{consume}" in res.stderr, res.describe()


LEAK = '''
import numpy as np
import np_leaky as L

def load():
    a = np.ones(1000)  # <-- leak
    L.keep_forever(a)

load()
print("gil=%s" % (sys._is_gil_enabled() if hasattr(sys, "_is_gil_enabled") else True))
'''


@pytest.mark.parametrize("tag", NEWEST_TAGS)
def test_leak_under_capsan_run_is_at_its_line(tmp_path, tag):
    n = newest_python(tag)
    script = tmp_path / "leak.py"
    script.write_text("import sys\n" + LEAK)
    res = run_newest(n, script, tmp_path)
    assert res.returncode == 23, res.describe()
    gil_stayed_off(n, res)
    assert kinds(res.report) == {"numpy-leak"}, summarize(res.report)
    line = marker_line(script, "leak")
    assert f"{script.name}:{line} in load" in res.stderr, res.describe()


LATE = '''
import json, sys
import numpy as np
import dlconsumer as C
import dlproducer as P
import capsan

assert capsan.start()

def consume():
    C.double_delete(P.good(4))  # <-- dd

consume()
print(json.dumps([[f.kind, f.at] for f in capsan.findings()]))
'''


@pytest.mark.parametrize("tag", NEWEST_TAGS)
def test_late_import_capsan_names_the_line(tmp_path, tag):
    """`import capsan` after numpy: once `at` was None on 3.14/3.15."""
    n = newest_python(tag)
    script = tmp_path / "late.py"
    script.write_text(LATE)
    res = run_newest(n, script, tmp_path, mode="plain", options=["protect=1"])
    assert res.returncode in (0, 23), res.describe()
    got = json.loads(res.stdout.strip().splitlines()[-1])
    assert got == [["dlpack-double-delete", f"{script.name}:{marker_line(script, 'dd')}"]], (
        got, res.describe())


@pytest.mark.parametrize("tag", NEWEST_TAGS)
def test_pytest_capsan_fails_the_leaking_test_at_its_line(tmp_path, tag):
    """pytest --capsan, the plugin found through the build's dist-info: the
    same outcomes and lines as on 3.10-3.13, and no crash (3.13t's
    reachability walk used to kill the session)."""
    from test_pytest_plugin import TESTS as SUITE, check_full_run, write_tests
    n = newest_python(tag)
    path = write_tests(tmp_path, SUITE)
    e = base_env()
    e["PYTHONPATH"] = f"{n.pydir}:{n.fixdir}"
    e["CAPSAN_OPTIONS"] = f"log_path={tmp_path / 't'}:protect=1"
    for k in ("PYTEST_ADDOPTS", "PYTEST_PLUGINS", "PYTEST_DISABLE_PLUGIN_AUTOLOAD"):
        e.pop(k, None)
    cmd, e = n.command([n.python, "-m", "pytest", "-p", "no:cacheprovider", "-rfE", "--capsan",
                        path.name], e, path.parent)
    cp = subprocess.run(cmd, capture_output=True, text=True, env=e, timeout=300,
                        cwd=str(path.parent), stdin=subprocess.DEVNULL, preexec_fn=no_core)
    cp.describe = (f"command: {' '.join(cmd)}\nrc={cp.returncode}\n--- stdout\n{cp.stdout[-8000:]}"
                   f"\n--- stderr\n{cp.stderr[-3000:]}")
    check_full_run(cp, path)


@pytest.mark.parametrize("tag", NEWEST_TAGS)
def test_clean_exchanges_report_nothing(tmp_path, tag):
    """numpy <-> numpy DLPack, threads handing arrays to each other, a fork,
    and (3.14: pyarrow and polars; 3.13t: pyarrow) Arrow both ways."""
    n = newest_python(tag)
    res = run_newest(n, CLEAN, tmp_path, args=["150", "4"], timeout=600)
    assert res.returncode == 0, res.describe()
    assert "errors=[]" in res.stdout, res.describe()
    gil_stayed_off(n, res)
    assert findings(res.report) == [], res.describe()
    if tag == "cp314":
        assert "arrow=True" in res.stdout and "polars=True" in res.stdout, res.stdout
    assert len(res.report["processes"]) == 2, summarize(res.report)  # the fork's child too


@pytest.mark.parametrize("tag", ["cp314", "cp315"])
def test_stdlib_suites_after_a_late_start(tmp_path, tag):
    """CPython's own tests of its extension modules (the testsuite
    package), with capsan started after they loaded, count what they count
    natively (tests/test_late_start.py on 3.10-3.13)."""
    from test_late_start import MODULES
    n = newest_python(tag)

    def run(*args):
        e = base_env()
        e["PYTHONPATH"] = str(n.pydir)
        e["CAPSAN_OPTIONS"] = f"log_path={tmp_path / 't'}"
        cmd, e2 = n.command([n.python, TESTS / "stdlib_late.py", *args, *MODULES], e, tmp_path)
        cp = subprocess.run(cmd, capture_output=True, text=True, env=e2, timeout=900,
                            cwd=str(tmp_path), stdin=subprocess.DEVNULL, preexec_fn=no_core)
        assert cp.returncode == 0, f"{cmd}\n{cp.returncode}\n{cp.stderr[-3000:]}"
        return json.loads(cp.stdout.strip().splitlines()[-1])

    native = run("--native")
    late = run()
    assert late == native
    assert native["test_decimal"][0] > 300, native


@pytest.mark.parametrize("tag", NEWEST_TAGS)
def test_numpy_dlpack_and_mem_policy_suites(tmp_path, tag):
    """numpy's own test_dlpack.py and test_mem_policy.py as its wheel ships
    them, under `pytest --capsan` (a late start): the same counts as
    natively, and no finding but two kinds of true ones: test_switch_owner's
    OWNDATA misuse (tests/test_numpy_suites.py says why it is one) and, in
    numpy 2.5, test_buffererror_bad_dtype's export of dtype code 123, which
    the test registers as "a nonsensical dtype" on purpose: no
    DLDataTypeCode is 123, so every consumer must refuse it (R18)."""
    from test_numpy_suites import SWITCH_OWNER
    n = newest_python(tag)
    cmd, e = n.command([n.python, "-c", "import numpy, os; print(os.path.dirname(numpy.__file__))"],
                       base_env())
    root = Path(subprocess.run(cmd, capture_output=True, text=True, env=e, check=True,
                               timeout=60).stdout.strip())
    tests = root / "_core" / "tests"
    if n.root is not None:
        tests = Path(str(n.root) + str(tests))
    files = [tests / "test_mem_policy.py", tests / "test_dlpack.py"]
    for f in files:
        assert f.exists(), f"{f}: numpy's wheel ships its tests"
    inside = [Path(str(f)[len(str(n.root)):]) if n.root else f for f in files]
    out = tmp_path / "capsan.json"

    def run(*extra):
        e = base_env()
        e["PYTHONPATH"] = f"{n.pydir}:{n.fixdir}"
        e["CAPSAN_OPTIONS"] = f"log_path={tmp_path / 't'}:exitcode=0"
        cmd, e2 = n.command([n.python, "-m", "pytest", "-p", "no:cacheprovider", "-q", "-rfE",
                             *map(str, inside), "-k", "not test_new_policy", *extra], e,
                            tmp_path)
        cp = subprocess.run(cmd, capture_output=True, text=True, env=e2, timeout=900,
                            cwd=str(tmp_path), stdin=subprocess.DEVNULL, preexec_fn=no_core)
        cp.describe = f"{' '.join(cmd)}\nrc={cp.returncode}\n{cp.stdout[-6000:]}\n{cp.stderr[-3000:]}"
        return cp

    late = run("--capsan", "--capsan-allow=numpy-foreign-free,dlpack-bad-tensor",
               f"--capsan-report={out}")
    native = run("-p", "no:capsan")
    assert native.returncode == 0, native.describe
    assert late.returncode == 0, late.describe
    summary = re.compile(r"^\d+ passed.*$", re.M)
    assert (summary.findall(late.stdout)[-1].split(" in ")[0] ==
            summary.findall(native.stdout)[-1].split(" in ")[0]), late.describe
    rep = json.loads(out.read_text())
    assert len(rep["tests"]) >= 60, late.describe
    with_findings = {t["nodeid"].split("::")[-1]: t["findings"] for t in rep["tests"]
                     if t["findings"]}
    bad_dtype = with_findings.pop("test_buffererror_bad_dtype", [])
    assert set(with_findings) <= SWITCH_OWNER, (with_findings, late.describe)
    for fs in with_findings.values():
        assert {f["kind"] for f in fs} == {"numpy-foreign-free"}, fs
    for f in bad_dtype:
        assert f["kind"] == "dlpack-bad-tensor" and "(value 123)" in f["message"], f
    assert rep["outside_tests"] == [], rep["outside_tests"]


@pytest.mark.parametrize("tag", NEWEST_TAGS)
def test_fork_worker_and_os_exit_leaks_are_found(tmp_path, tag):
    """The _exit verdicts (a reachability scan): a fork worker's leaked
    tensors and a program's at os._exit, every one. On 3.13t there are no
    pymalloc pools: a freed capsule's stale word in a mimalloc block kept
    the tensors "reachable" until ftdead.c learnt to tell a dead object."""
    from test_endings import DEFAULT_EXITCODE, MP, QE, check_leaks
    n = newest_python(tag)
    res = run_newest(n, MP, tmp_path / "mp", args=["fork", "leak"])
    assert f"exitcodes [0, 0, {DEFAULT_EXITCODE}, 0]" in res.stdout, res.describe()
    check_leaks(res, MP, "_exit", indirect=False)
    res = run_newest(n, QE, tmp_path / "qe", args=["leak"])
    assert res.returncode == DEFAULT_EXITCODE, res.describe()
    check_leaks(res, QE, "_exit")


@pytest.mark.parametrize("tag", NEWEST_TAGS)
def test_fork_workers_holding_their_arrays_are_clean(tmp_path, tag):
    """The other side of the scan: what a live object still holds at
    _exit is no leak (a dead object's rule must not hide a live one)."""
    from test_endings import MP, errors
    n = newest_python(tag)
    res = run_newest(n, MP, tmp_path, args=["fork", "clean"])
    assert res.returncode == 0 and "exitcodes [0, 0, 0, 0]" in res.stdout, res.describe()
    assert errors(res.report) == [], summarize(res.report)
    assert len(res.report["processes"]) >= 5, summarize(res.report)


@pytest.mark.parametrize("mode", ["run", "late"])
def test_pyarrow_capsule_interface_suite_on_314(tmp_path, mode):
    """pyarrow 26.0.1's own tests of the Arrow PyCapsule interface (arrays,
    tables, types, and test_cffi.py's capsule round trips), as its wheel
    ships them, on 3.14: they pass, count what they count natively, and
    capsan, watching their Arrow traffic, reports nothing."""
    from test_upstream_suites import PYARROW_CAPSULE_K, counts
    n = newest_python("cp314")
    cmd, e = n.command([n.python, "-c", "import pyarrow, os; print(os.path.dirname(pyarrow.__file__))"],
                       base_env())
    site = subprocess.run(cmd, capture_output=True, text=True, env=e, check=True,
                          timeout=120).stdout.strip()
    t = Path(site) / "tests"
    args = ["-m", "pytest", "-p", "no:cacheprovider", "-q", "-rfEs",
            *[str(t / f) for f in ("test_array.py", "test_table.py", "test_types.py",
                                   "test_cffi.py")], "-k", PYARROW_CAPSULE_K]

    def run(how, where):
        where.mkdir(parents=True, exist_ok=True)
        env = base_env()
        env["PYTHONPATH"] = str(n.pydir)
        env["PYTEST_DISABLE_PLUGIN_AUTOLOAD"] = "1"
        out = where / "capsan.json"
        if how == "run":
            argv = [n.capsan, "run", "--keep-trace", "--log-path", where / "t", "--", n.python,
                    *args]
        elif how == "late":
            env["CAPSAN_OPTIONS"] = f"log_path={where / 't'}:exitcode=0:keep_trace=always"
            argv = [n.python, *args, "-p", "capsan.pytest_plugin", "--capsan",
                    f"--capsan-report={out}"]
        else:
            argv = [n.python, *args]
        cmd, e = n.command(argv, env, where)
        cp = subprocess.run(cmd, capture_output=True, text=True, env=e, timeout=1200,
                            cwd=str(where), stdin=subprocess.DEVNULL, preexec_fn=no_core)
        cp.describe = f"{' '.join(map(str, cmd))}\nrc={cp.returncode}\n{cp.stdout[-5000:]}\n{cp.stderr[-3000:]}"
        traces = trace_files(where)
        report = capsan_report(traces)[1] if traces else None
        plugin = json.loads(out.read_text()) if out.exists() else None
        return cp, report, plugin

    cp, report, plugin = run(mode, tmp_path / mode)
    assert cp.returncode == 0, cp.describe
    c = counts(cp.stdout)
    assert c.get("passed", 0) >= 28 and not c.get("failed") and not c.get("error"), (c, cp.describe)
    assert report is not None, cp.describe
    assert findings(report) == [], summarize(report)
    if mode == "run":
        w = re.search(r"tensors?, (\d+) NumPy blocks? and (\d+) Arrow struct", cp.stderr)
        assert w and int(w.group(2)) >= 100, cp.describe
    else:
        assert plugin is not None and len(plugin["tests"]) >= 28, cp.describe
        assert not [t for t in plugin["tests"] if t["findings"]], cp.describe
        ncp, _, _ = run("native", tmp_path / "native")
        assert counts(ncp.stdout) == c, (counts(ncp.stdout), c)


@pytest.mark.parametrize("tag", NEWEST_TAGS)
def test_double_free_never_crashes_capsan_on_the_newest(tmp_path, tag):
    """make demo's program without protect=1 (the second free really
    happens) on each newest interpreter: under Debian unstable's glibc 2.43
    capsan's exit handler once died in 5 runs of 5 (its tables shared
    glibc's heap with the program's freed blocks). CAPSAN_HEAP_RUNS runs."""
    from test_own_heap import DEMO, RUNS, judge_demo_run
    n = newest_python(tag)
    for i in range(RUNS):
        judge_demo_run(run_newest(n, DEMO, tmp_path / f"run{i}"), i)
