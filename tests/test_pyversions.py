"""Python frames on every CPython the machine has (issue 13).

The runtime is built once, without Python headers, and reads frames and
code objects at the offsets of preload/core/pyversions.inc. These tests check
that table against each interpreter's own headers, then that findings
carry the right Python file:line on Debian's 3.11 (static and shared
libpython) and pyenv's 3.10-3.13 (shared libpython, numpy 2): from the
thread that holds the GIL, from a consumer written in ctypes, and from a
thread that released the GIL."""
import re
import subprocess

import pytest

from conftest import (BUILD, CURRENT, ROOT, SCENARIOS, STATIC_PY, assert_finding_at,
                      findings, kinds, run_capsan, summarize)

TABLE = ROOT / "preload" / "core" / "pyversions.inc"
PROBE = ROOT / "tests" / "pylayout" / "probe.c"


def table_rows() -> dict:
    rows = {}
    for m in re.finditer(r"^PYV\((\d+),(.*)\)\s*$", TABLE.read_text(), re.M):
        rows[int(m.group(1))] = "PYV(" + m.group(1) + "," + m.group(2) + ")"
    assert rows, "no PYV rows in pyversions.inc"
    return rows


def include_dirs() -> dict:
    """{label: include dir} of every CPython here whose headers we have."""
    out = {}
    if STATIC_PY.exists():
        out["debian-3.11"] = subprocess.run(
            [str(STATIC_PY), "-c", "import sysconfig; print(sysconfig.get_paths()['include'])"],
            capture_output=True, text=True, check=True).stdout.strip()
    for tag, py in CURRENT.items():
        out[tag] = subprocess.run(
            [str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['include'])"],
            capture_output=True, text=True, check=True).stdout.strip()
    return out


@pytest.mark.parametrize("label", sorted(include_dirs()))
def test_layout_table_matches_the_interpreters_headers(tmp_path, label):
    inc = include_dirs()[label]
    exe = tmp_path / "probe"
    cc = subprocess.run(["cc", "-std=c11", "-D_GNU_SOURCE", "-I" + inc, "-o", str(exe), str(PROBE)],
                        capture_output=True, text=True)
    assert cc.returncode == 0, cc.stderr
    row = subprocess.run([str(exe)], capture_output=True, text=True, check=True).stdout.strip()
    minor = int(row[len("PYV("):].split(",")[0])
    norm = lambda s: re.sub(r"\s+", "", s)
    assert minor in table_rows(), f"CPython 3.{minor} has no row; add:\n{row}"
    assert norm(table_rows()[minor]) == norm(row), (
        f"pyversions.inc's row for 3.{minor} differs from {label}'s headers:\n"
        f"table: {table_rows()[minor]}\nprobe: {row}")


def test_every_interpreter_here_has_a_row():
    rows = table_rows()
    for tag in CURRENT:
        assert int(tag[3:]) in rows, tag
    assert 11 in rows


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


def test_unknown_version_gets_a_note_and_native_stacks(tmp_path):
    """A CPython without a row: verbosity=1 says so; findings still come,
    with native frames only, never a wrong line. Simulated by hiding every
    row: a runtime built from an empty table."""
    src = TABLE.read_text()
    empty = tmp_path / "inc"
    empty.mkdir()
    (empty / "pyversions.inc").write_text(
        "\n".join(l for l in src.splitlines() if not l.startswith("PYV(")) +
        "\nPYV(99, CS_PYF_OBJECT, -1, 0, 0, 0, 0, -1, -1, -1, -1, 0, 0, 0, -1, -1, -1, 0, 0, 0, 0, -1, -1)\n")
    lib = tmp_path / "libcapsan.so"
    # the runtime's objects, as the Makefile lists them (a build tree may
    # hold stale objects of files that moved)
    srcs = sorted(ROOT.glob("preload/**/*.c")) + sorted(ROOT.glob("model/*.c"))
    objs = [BUILD / "obj" / "rt" / s.parent.relative_to(ROOT) / (s.stem + ".o") for s in srcs
            if s.name != "pyversion.c"]
    pv = tmp_path / "pyversion.o"
    # beside the table it includes (a quoted include looks there first)
    (empty / "pyversion.c").write_text((ROOT / "preload" / "core" / "pyversion.c").read_text())
    cc = subprocess.run(["cc", "-std=c11", "-D_GNU_SOURCE", "-fPIC", "-fvisibility=hidden",
                         *["-I" + str(d) for d in sorted({h.parent for h in
                                                          ROOT.glob("preload/**/*.h")})],
                         "-c", str(empty / "pyversion.c"),
                         "-o", str(pv)],
                        capture_output=True, text=True)
    assert cc.returncode == 0, cc.stderr
    # the objects are LTO's (the Makefile's RT_CFLAGS): linked as it links them
    ld = subprocess.run(["cc", "-O2", "-flto", "-flto-partition=one", "-shared", "-o", str(lib),
                         *map(str, objs), str(pv),
                         "-Wl,--version-script=" + str(ROOT / "preload" / "exports.map"),
                         "-ldl", "-lpthread"], capture_output=True, text=True)
    assert ld.returncode == 0, ld.stderr
    res = run_capsan(CTYPES, tmp_path / "run", mode="preload", options=["verbosity=1"],
                     lib=lib)
    assert "is not in capsan's table" in res.stderr, res.describe()
    assert res.returncode == 23, res.describe()
    fs = findings(res.report, "dlpack-leak")
    assert fs, res.describe()
    for f in findings(res.report):
        for ev in f["events"]:
            assert ev["stack"], f
            assert not any(fr.get("python") for fr in ev["stack"]), ev["stack"]
