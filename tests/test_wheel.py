"""The wheel `make wheel` builds (build/wheel/capsan-*-manylinux_*.whl, by
.ci/wheel), installed and used on a machine without the libraries a build
from source needs at run time.

Every command here runs in a mount namespace of its own (`unshare -m`) in
which each file ldconfig knows for Debian's libdw, libelf, libunwind
(with -x86_64, -ptrace, -coredump) and liblzma has an empty file
bind-mounted over it: the loader still finds those names, and cannot load
them. No LD_LIBRARY_PATH, PYTHONPATH or LD_PRELOAD either. There, a fresh
venv of a pyenv CPython gets the cached venv's numpy and pytest and the
wheel; then

- auditwheel calls it manylinux_2_28 or older, and no ELF file in it asks
  for a glibc symbol version newer than 2.28 (.ci/wheel_deps builds them
  all with zig cc for glibc 2.28);
- `capsan` from the venv's PATH runs a leaking program: a dlpack-leak with
  its stack (native frames unwound by the wheel's libunwind, named by the
  tool's own libdw, and the Python line), exit status 23; the program reads
  its own /proc/self/maps and its parent's (the tool): the runtime is the
  venv's, libunwind the wheel's (its liblzma linked in), and the tool maps
  no libdw, libelf or compression library at all;
- `pytest --capsan` fails a leaky test and passes a clean one, with the
  same libraries mapped;
- `ldd` agrees for the tool and the bundled libunwind: glibc alone.

`make test` and `make test-wheel` run it (both build the wheel first).
Needs root for the mount namespace (as make test has on this machine and
in CI); elsewhere it is skipped.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import zipfile
from pathlib import Path

import pytest

from conftest import BUILD, CURRENT, DEFAULT_EXITCODE, ROOT
from test_install import (LEAK_PY, PIP_TIMEOUT, TWO_TESTS, _stack, base_python,
                          check_two_tests, clean_env, run)

WHEEL_DIR = BUILD / "wheel"
# the tools venv .ci/wheel used (one per set of pins): it names it in build/wheel/tools
TOOLS_NOTE = WHEEL_DIR / "tools"
# the oldest glibc the wheel is for: RHEL 8 and its rebuilds
MAX_GLIBC = (2, 28)
# what ldd may list for the tool and libunwind: glibc's own files (before
# glibc 2.34, libpthread and libdl are apart from libc)
GLIBC_PARTS = re.compile(r"(linux-vdso\.so\.1|libc\.so\.6|libpthread\.so\.0|libdl\.so\.2|"
                         r"libm\.so\.6|/lib64/ld-linux-x86-64\.so\.2|ld-linux-x86-64\.so\.2)$")
# the -dev packages' run-time libraries (libdw-dev, libelf-dev, libunwind-dev)
HIDDEN = re.compile(r"^(libdw|libelf|libunwind(-\w+)?|liblzma)\.so\.\d+$")
# what the tool may map: glibc only (it is linked with the rest)
BUNDLED_NAMES = re.compile(r"lib(dw|elf|z|lzma|bz2|zstd|unwind)\b")

# what the runtime loads, and any copy of libdw or libelf
RUNTIME_NAMES = re.compile(r"lib(capsan|unwind|lzma|dw|elf)\b")

# LEAK_PY, then the libraries of interest mapped by this process and by
# its parent (the capsan tool that runs it)
MAPS_PY = LEAK_PY + '''
import os, re
want = re.compile(r"lib(dw|elf|z|lzma|bz2|zstd|unwind|capsan)\\b")
for who, pid in (("self", "self"), ("tool", str(os.getppid()))):
    with open(f"/proc/{pid}/maps") as f:
        paths = {line.split()[-1] for line in f if "/" in line}
    for p in sorted(paths):
        if who == "tool" or want.search(os.path.basename(p)):
            print(f"{who}-maps:", p, flush=True)
'''

# beside test_two.py: the libraries pytest's process had mapped at the end
MAPS_CONFTEST = '''
def pytest_sessionfinish(session):
    with open("/proc/self/maps") as f, open("maps.txt", "w") as out:
        out.writelines(sorted({line.split()[-1] + "\\n" for line in f if "/" in line}))
'''


def hidden_files() -> list[str]:
    """The files behind the sonames to hide, as ldconfig lists them."""
    out = subprocess.run(["/sbin/ldconfig", "-p"], capture_output=True, text=True,
                         check=True).stdout
    files = set()
    for line in out.splitlines():
        m = re.match(r"\s*(\S+) \(([^)]*)\) => (\S+)$", line)
        if m and HIDDEN.match(m.group(1)) and "x86-64" in m.group(2):
            files.add(os.path.realpath(m.group(3)))
    return sorted(files)


@pytest.fixture(scope="module")
def hide(tmp_path_factory):
    """A command prefix: run argv in a new mount namespace with the files
    of hidden_files() covered by an empty one."""
    if os.geteuid() != 0 or not shutil.which("unshare"):
        pytest.skip("needs root and unshare(1) for a mount namespace")
    files = hidden_files()
    names = {re.match(r"lib[a-z]+", os.path.basename(f)).group(0) for f in files}
    assert names == {"libdw", "libelf", "libunwind", "liblzma"}, files
    d = tmp_path_factory.mktemp("hide")
    (d / "empty").write_bytes(b"")
    script = d / "hide.sh"
    script.write_text("set -e\n"
                      + "".join(f"mount --bind {d / 'empty'} '{f}'\n" for f in files)
                      + 'exec "$@"\n')
    return ["unshare", "--mount", "--propagation", "private", "sh", str(script)]


def the_wheel() -> Path:
    wheels = sorted(WHEEL_DIR.glob("capsan-*-py3-none-manylinux_*_x86_64.whl"))
    if len(wheels) != 1:
        pytest.fail(f"want one manylinux wheel in {WHEEL_DIR}, found "
                    f"{[w.name for w in wheels]}: run `make wheel`", pytrace=False)
    return wheels[0]


@pytest.fixture(scope="module")
def wheel_venv(hide, tmp_path_factory):
    """A fresh venv with numpy, pytest and the wheel, made under `hide`."""
    stack = _stack()
    tag = "cp311" if "cp311" in stack else max(stack, default=None)
    if tag is None:
        pytest.skip("no pyenv CPython 3.10-3.13 on this machine (.ci/venvs found none)")
    base = base_python(tag, stack[tag])
    # the versions the cached venv has, so pip takes them from its cache
    cp = run([stack[tag], "-c", "import numpy, pytest; print(numpy.__version__, pytest.__version__)"],
             env=clean_env())
    assert cp.returncode == 0, cp.describe
    numpy_v, pytest_v = cp.stdout.split()
    venv = tmp_path_factory.mktemp(f"wheel-{tag}") / "v"
    env = clean_env()
    for cmd in ([base, "-m", "venv", venv],
                [venv / "bin" / "python", "-m", "pip", "install", "-q", "--no-input",
                 "--disable-pip-version-check", f"numpy=={numpy_v}", f"pytest=={pytest_v}",
                 the_wheel()]):
        cp = run([*hide, *cmd], env=env, timeout=PIP_TIMEOUT)
        assert cp.returncode == 0, cp.describe
    return venv


def test_wheel_is_manylinux():
    """auditwheel (the pinned one .ci/wheel used) calls the wheel manylinux,
    with no library it would still have to graft."""
    if not TOOLS_NOTE.exists():
        pytest.fail(f"{TOOLS_NOTE} missing: run `make wheel`", pytrace=False)
    aw = Path(TOOLS_NOTE.read_text().strip()) / "bin" / "auditwheel"
    if not aw.exists():
        pytest.fail(f"{aw} missing: run `make wheel`", pytrace=False)
    wheel = the_wheel()
    cp = run([aw, "show", "--json", wheel], env=clean_env())
    assert cp.returncode == 0, cp.describe
    verdict = json.loads(cp.stdout)
    m = re.fullmatch(r"manylinux_2_(\d+)_x86_64", verdict["overall_tag"])
    assert m and (2, int(m.group(1))) <= MAX_GLIBC, verdict
    assert verdict["overall_tag"] in wheel.name, (verdict, wheel.name)
    assert verdict["external_libs"] == {}, verdict


def test_wheel_glibc_symbols(tmp_path):
    """No ELF file in the wheel asks for a GLIBC_ symbol version newer than
    MAX_GLIBC (objdump -T), and the three there are: the tool, the runtime,
    libunwind."""
    with zipfile.ZipFile(the_wheel()) as z:
        z.extractall(tmp_path)
    newest = {}
    for f in sorted(p for p in tmp_path.rglob("*") if p.is_file()):
        if f.read_bytes()[:4] != b"\x7fELF":
            continue
        cp = run(["objdump", "-T", f], env=clean_env())
        assert cp.returncode == 0, cp.describe
        versions = {tuple(map(int, v.split("."))) for v in re.findall(r"GLIBC_([\d.]+)", cp.stdout)}
        assert versions, cp.describe
        newest[f.relative_to(tmp_path).as_posix().split("/", 1)[-1]] = max(versions)
    assert sorted(newest) == ["data/lib/capsan.libs/libunwind-capsan.so.8",
                              "data/lib/libcapsan.so", "scripts/capsan"], newest
    assert all(v <= MAX_GLIBC for v in newest.values()), newest


def test_wheel_hides(hide):
    """Under `hide` the system's copies cannot be loaded (else this file
    would prove nothing); outside they can."""
    code = ("import ctypes, sys\n"
            "for n in sys.argv[1:]:\n"
            "    try:\n        ctypes.CDLL(n); print('loaded', n)\n"
            "    except OSError as e:\n        print('refused', n)\n")
    names = ["libdw.so.1", "libelf.so.1", "libunwind.so.8", "liblzma.so.5"]
    inside = run([*hide, "/usr/bin/python3", "-c", code, *names], env=clean_env())
    assert inside.returncode == 0, inside.describe
    assert inside.stdout.split("\n")[:-1] == [f"refused {n}" for n in names], inside.describe
    outside = run(["/usr/bin/python3", "-c", code, *names], env=clean_env())
    assert outside.stdout.split("\n")[:-1] == [f"loaded {n}" for n in names], outside.describe


def test_wheel_files(wheel_venv, hide):
    """The tool in the venv's bin/, the runtime in its lib/, libunwind (its
    liblzma linked in) alone in lib/capsan.libs/; ldd (under `hide`)
    resolves the tool and libunwind to glibc's files alone."""
    libs = wheel_venv / "lib" / "capsan.libs"
    unwind = libs / "libunwind-capsan.so.8"
    assert (wheel_venv / "bin" / "capsan").exists() and (wheel_venv / "lib" / "libcapsan.so").exists()
    assert sorted(p.name for p in libs.iterdir()) == [unwind.name]
    env = clean_env()
    for f in (wheel_venv / "bin" / "capsan", unwind):
        cp = run([*hide, "ldd", f], env=env)
        assert cp.returncode == 0, cp.describe
        deps = [line.split()[0] for line in cp.stdout.splitlines() if line.strip()]
        assert all(GLIBC_PARTS.match(d) for d in deps), cp.describe


def check_maps(paths, venv):
    """Of the libraries the runtime brings, the process mapped the venv's
    runtime and the wheel's libunwind, and no other copy (nor any liblzma,
    libdw or libelf: libunwind has its liblzma linked in). The
    interpreter's own libz is its business."""
    libs = venv / "lib" / "capsan.libs"
    got = {p for p in paths if RUNTIME_NAMES.match(os.path.basename(p))}
    want = {str(venv / "lib" / "libcapsan.so"), str(libs / "libunwind-capsan.so.8")}
    assert got == want, (sorted(got), sorted(want))


def test_wheel_capsan_run(wheel_venv, hide, tmp_path):
    """`capsan run -- python leak.py` under `hide`: dlpack-leak with native
    and Python frames, exit 23, the wheel's libraries mapped, a JSON report."""
    (tmp_path / "leak.py").write_text(MAPS_PY)
    env = clean_env(wheel_venv / "bin")
    cp = run([*hide, "capsan", "run", "--log-path", tmp_path / "t", "--", "python", "leak.py"],
             env=env, cwd=tmp_path)
    assert cp.returncode == DEFAULT_EXITCODE, cp.describe
    assert f"runtime: {wheel_venv / 'lib' / 'libcapsan.so'}\n" in cp.stdout, cp.describe
    self_maps = re.findall(r"^self-maps: (.*)$", cp.stdout, re.M)
    tool_maps = re.findall(r"^tool-maps: (.*)$", cp.stdout, re.M)
    check_maps(self_maps, wheel_venv)
    assert str(wheel_venv / "bin" / "capsan") in tool_maps, cp.describe
    assert not [p for p in tool_maps if BUNDLED_NAMES.search(os.path.basename(p))], tool_maps

    # the leak's export stack: numpy's native frame (libunwind), a symbol
    # name (the tool's libdw), then the Python line
    report = cp.stderr
    m = re.search(r"dlpack-leak: Direct leak of 64 byte\(s\) in 1 object\(s\) exported from:\n"
                  r"((?:    #\d+ .*\n)+)", report)
    assert m, cp.describe
    frames = m.group(1)
    assert re.search(r"#\d+ 0x[0-9a-f]+ .*_multiarray_umath", frames), frames
    assert re.search(r"#\d+ 0x[0-9a-f]+ in [A-Za-z_]\w* \(", frames), frames
    assert re.search(r"#\d+ .*/leak\.py:\d+ in <module>\n$", frames), frames

    traces = sorted(p for p in tmp_path.iterdir() if re.fullmatch(r"t\.\d+", p.name))
    assert len(traces) == 1, cp.describe
    rep = run([*hide, "capsan", "report", "--format", "json", traces[0]], env=env)
    assert rep.returncode == 0, rep.describe
    kinds = [f["kind"] for proc in json.loads(rep.stdout)["processes"] for f in proc["findings"]]
    assert "dlpack-leak" in kinds, rep.stdout[:3000]


def test_wheel_pytest_plugin(wheel_venv, hide, tmp_path):
    """`pytest --capsan` under `hide`: the leaky test fails naming the kind,
    the clean one passes, and pytest's process mapped the wheel's libraries."""
    (tmp_path / "test_two.py").write_text(TWO_TESTS)
    (tmp_path / "conftest.py").write_text(MAPS_CONFTEST)
    env = clean_env(wheel_venv / "bin")
    env["CAPSAN_OPTIONS"] = f"log_path={tmp_path / 't'}"
    cp = run([*hide, "pytest", "--capsan", "-p", "no:cacheprovider", "-rA", "test_two.py"],
             env=env, cwd=tmp_path)
    check_two_tests(cp)
    check_maps((tmp_path / "maps.txt").read_text().split("\n")[:-1], wheel_venv)
