"""Python frames on every CPython the machine has (issues 13 and 43).

The runtime is built once, without Python headers. It reads frames and
code objects at the offsets of preload/core/pyversions.inc for 3.10-3.12,
and from the layout the interpreter publishes about itself
(_Py_DebugOffsets) from 3.13 on. These tests check what the runtime
derives against each interpreter's own headers (tests/pylayout/probe.c),
the newest ones (3.14, 3.15 in their chroot, the free-threaded 3.13t)
included, then that findings carry the right Python file:line on Debian's
3.11 (static and shared libpython) and pyenv's 3.10-3.13 (shared
libpython, numpy 2): from the thread that holds the GIL, from a consumer
written in ctypes, and from a thread that released the GIL. An
interpreter whose layout capsan cannot prove gets native stacks and no
false finding."""
import re
import subprocess
from pathlib import Path

import pytest

from conftest import (BUILD, CAPSAN, CURRENT, NEWEST, NEWEST_TAGS, ROOT, SCENARIOS, STATIC_PY,
                      assert_finding_at, base_env, findings, kinds, newest_python, run_capsan,
                      summarize)

TABLE = ROOT / "preload" / "core" / "pyversions.inc"
PROBE = ROOT / "tests" / "pylayout" / "probe.c"
LAYOUT_LINE = re.compile(r"CPython 3\.(\d+)'s layout, from (.*?): (PYV\(.*)$", re.M)


def host_pythons() -> dict:
    """{label: python} of every CPython on the host whose headers we have."""
    out = {}
    if STATIC_PY.exists():
        out["debian-3.11"] = STATIC_PY
    out.update({tag: Path(py) for tag, py in CURRENT.items()})
    return out


def fields(row: str) -> tuple[list, dict]:
    """A probe or runtime line: the PYV row's values, and the key=value
    fields after it."""
    m = re.match(r"PYV\((.*?)\)(.*)$", row.strip())
    assert m, row
    vals = [v.strip() for v in m.group(1).split(",")]
    extra = dict(kv.split("=") for kv in m.group(2).split())
    return vals, extra


def compare(probe: str, derived: str, label: str) -> None:
    pv, pe = fields(probe)
    dv, de = fields(derived)
    assert pv == dv, f"{label}: capsan derives\n{derived}\nthe headers say\n{probe}"
    tag_p, tag_d = int(pe.pop("exec_tag")), int(de.pop("exec_tag"))
    # capsan clears at least every tag bit the headers define
    assert tag_d & tag_p == tag_p, (label, tag_p, tag_d)
    assert pe == de, f"{label}: capsan derives {de}, the headers say {pe}"


def verbose_env() -> dict:
    e = base_env()
    e["CAPSAN_OPTIONS"] = "verbosity=2"
    return e


def derived_layout(cmd: list, env: dict) -> tuple[str, str]:
    """the layout the runtime says it derived (env: verbose_env())"""
    cp = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=120)
    m = LAYOUT_LINE.search(cp.stderr)
    assert m, f"no layout line:\n{cp.stderr[-3000:]}"
    return m.group(3), m.group(2)


def probe_row(cc: list, inc: str, exe: Path, run: list) -> str:
    c = subprocess.run([*cc, "-std=c11", "-D_GNU_SOURCE", "-I" + inc, "-o", str(exe), str(PROBE)],
                       capture_output=True, text=True)
    assert c.returncode == 0, c.stderr
    return subprocess.run(run, capture_output=True, text=True, check=True).stdout.strip()


@pytest.mark.parametrize("label", sorted(host_pythons()))
def test_derived_layout_matches_the_interpreters_headers(tmp_path, label):
    py = host_pythons()[label]
    inc = subprocess.run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['include'])"],
                         capture_output=True, text=True, check=True).stdout.strip()
    exe = tmp_path / "probe"
    probe = probe_row(["cc"], inc, exe, [str(exe)])
    derived, source = derived_layout([str(CAPSAN), "run", "--", str(py), "-c", "pass"],
                                     verbose_env())
    minor = int(fields(probe)[0][0])
    assert ("_Py_DebugOffsets" in source) == (minor >= 13), source
    compare(probe, derived, label)


@pytest.mark.parametrize("tag", NEWEST_TAGS)
def test_newest_derived_layout_matches_their_headers(tmp_path, tag):
    """3.14 and 3.15 (the probe built by their chroot's gcc against their
    own headers) and the free-threaded 3.13t (+16 bytes of object head)."""
    n = newest_python(tag)
    cmd, e = n.command([n.python, "-c", "import sysconfig; print(sysconfig.get_paths()['include'])"],
                       base_env())
    inc = subprocess.run(cmd, capture_output=True, text=True, env=e, check=True).stdout.strip()
    exe = tmp_path / "probe"
    cc, _ = n.command(["cc"], {})
    run, _ = n.command([exe], {})
    probe = probe_row(cc, inc, exe, run)
    cmd, e = n.command([n.capsan, "run", "--", n.python, "-c", "pass"], verbose_env())
    derived, source = derived_layout(cmd, e)
    assert "_Py_DebugOffsets" in source, source
    compare(probe, derived, tag)
    assert fields(derived)[1]["free_threaded"] == ("1" if n.free_threaded else "0")


def test_the_table_has_no_row_past_3_12():
    rows = [int(m) for m in re.findall(r"^PYV\((\d+),", TABLE.read_text(), re.M)]
    assert rows == [10, 11, 12], rows


CTYPES = SCENARIOS / "dl_ctypes_leak.py"


def test_ctypes_leak_has_its_line(tmp_path, anypy):
    """A DLPack leak made by a pure-ctypes consumer of a numpy export."""
    res = run_capsan(CTYPES, tmp_path, interpreter=anypy)
    assert res.returncode == 23, res.describe()
    f = assert_finding_at(res, "dlpack-leak", CTYPES, "consume", event="consume")
    # the frames below it are the callers, in order, with their functions
    ev = [e for e in f["events"] if e["event"] == "consume"][0]
    py = [(fr["line"], fr["function"]) for fr in ev["stack"] if fr.get("python")
          and fr["file"].endswith(CTYPES.name)]
    src = CTYPES.read_text().splitlines()
    load_line = next(i for i, s in enumerate(src, 1) if "return consume(" in s)
    mod_line = next(i for i, s in enumerate(src, 1) if s.startswith("load(1000)"))
    assert py[1:] == [(load_line, "load"), (mod_line, "<module>")], py
    assert py[0][1] == "consume", py


LEAK = SCENARIOS / "dl_leak.py"


def test_fixture_consumer_leak_of_a_numpy_export_has_its_line(tmp_path, anypy):
    """numpy's export (numpy 2 on pyenv's CPythons) consumed by a C fixture
    and never released."""
    res = run_capsan(LEAK, tmp_path, interpreter=anypy, args=["consumed"])
    assert res.returncode == 23, res.describe()
    assert "dlpack-leak" in kinds(res.report), summarize(res.report)
    src = LEAK.read_text()
    tags = re.findall(r"#\s*<--\s*(\S+)", src)
    hit = [t for t in tags if "consume" in t]
    assert hit, tags
    assert_finding_at(res, "dlpack-leak", LEAK, hit[0], innermost=False)


GIL = SCENARIOS / "gil_calls.py"


def test_frames_of_a_thread_without_the_gil(tmp_path, anypy):
    """The thread released the GIL inside C code and then called the
    capsule API: its Python frames are read without the GIL."""
    res = run_capsan(GIL, tmp_path, interpreter=anypy, args=["capsule-numpy"])
    assert res.returncode == 0, res.describe()
    assert_finding_at(res, "capsule-no-gil", GIL, "nogil-capsule-numpy", event="call")
    assert kinds(res.report) == {"capsule-no-gil"}, summarize(res.report)


def runtime_without_layouts(tmp_path, name: str, text: str):
    """libcapsan.so built with core/NAME replaced by TEXT (pyversion.c, or
    pydebugoffsets.c, compiled beside the replaced table it includes)."""
    inc = tmp_path / "inc"
    inc.mkdir(exist_ok=True)
    (inc / name).write_text(text)
    src = {"pyversions.inc": "pyversion.c", "pydebugoffsets.inc": "pydebugoffsets.c"}[name]
    lib = tmp_path / "libcapsan.so"
    # the runtime's objects, as the Makefile lists them (a build tree may
    # hold stale objects of files that moved)
    srcs = sorted(ROOT.glob("preload/**/*.c")) + sorted(ROOT.glob("model/*.c"))
    objs = [BUILD / "obj" / "rt" / s.parent.relative_to(ROOT) / (s.stem + ".o") for s in srcs
            if s.name != src]
    obj = tmp_path / (src + ".o")
    # beside the table it includes (a quoted include looks there first)
    (inc / src).write_text((ROOT / "preload" / "core" / src).read_text())
    cc = subprocess.run(["cc", "-std=c11", "-D_GNU_SOURCE", "-fPIC", "-fvisibility=hidden",
                         *["-I" + str(d) for d in sorted({h.parent for h in
                                                          ROOT.glob("preload/**/*.h")})],
                         "-c", str(inc / src), "-o", str(obj)],
                        capture_output=True, text=True)
    assert cc.returncode == 0, cc.stderr
    # the objects are LTO's (the Makefile's RT_CFLAGS): linked as it links them
    ld = subprocess.run(["cc", "-O2", "-flto", "-flto-partition=one", "-shared", "-o", str(lib),
                         *map(str, objs), str(obj),
                         "-Wl,--version-script=" + str(ROOT / "preload" / "exports.map"),
                         "-ldl", "-lpthread"], capture_output=True, text=True)
    assert ld.returncode == 0, ld.stderr
    return lib


def no_rows(path, macro: str) -> str:
    return "\n".join(l for l in path.read_text().splitlines() if not l.startswith(macro + "("))


def assert_native_only_leak(res):
    assert res.returncode == 23, res.describe()
    assert findings(res.report, "dlpack-leak"), res.describe()
    for f in findings(res.report):
        for ev in f["events"]:
            assert ev["stack"], f
            assert not any(fr.get("python") for fr in ev["stack"]), ev["stack"]


def test_unknown_version_gets_a_note_and_native_stacks(tmp_path):
    """A CPython 3.10-3.12 without a row: verbosity=1 says so; findings
    still come, with native frames only, never a wrong line. Simulated by
    hiding every row: a runtime built from an empty table."""
    lib = runtime_without_layouts(tmp_path, "pyversions.inc", no_rows(TABLE, "PYV"))
    res = run_capsan(CTYPES, tmp_path / "run", mode="preload", options=["verbosity=1"],
                     lib=lib)
    assert "cannot be proven (no row in pyversions.inc)" in res.stderr, res.describe()
    assert_native_only_leak(res)


DBO = ROOT / "preload" / "core" / "pydebugoffsets.inc"


def test_unprovable_debug_offsets_give_no_false_finding(tmp_path):
    """A 3.13+ whose _Py_DebugOffsets capsan cannot read (a version newer
    than it knows, simulated by a runtime that knows none): a note, native
    stacks, a real leak still found, and no false finding in a NumPy
    program, whose import-time blocks can no longer be told from leaks
    (once a numpy-leak in every NumPy program on 3.14)."""
    if "cp313" not in CURRENT:
        pytest.skip("no cp313 venv on this machine (make venvs)")
    lib = runtime_without_layouts(tmp_path, "pydebugoffsets.inc", no_rows(DBO, "DBO"))
    py = CURRENT["cp313"]
    res = run_capsan("import numpy as np\nprint(np.ones(10).sum())\nb = np.zeros((3, 3)) + 1\n",
                     tmp_path / "np", mode="preload", options=["verbosity=1"], lib=lib,
                     interpreter=py)
    assert "newer than capsan knows" in res.stderr, res.describe()
    assert res.returncode == 0 and "10.0" in res.stdout, res.describe()
    assert findings(res.report) == [], res.describe()
    assert res.report["processes"][0]["summary"]["events"] > 20, res.describe()
    res = run_capsan(CTYPES, tmp_path / "leak", mode="preload", lib=lib, interpreter=py)
    assert_native_only_leak(res)
