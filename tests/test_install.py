"""Installing capsan, then using it with no PYTHONPATH, LD_PRELOAD or
LD_LIBRARY_PATH:

- `pip install <checkout>` (pyproject.toml + CMakeLists.txt, scikit-build-core)
  into a fresh venv of a pyenv CPython: the `capsan` command on the venv's
  PATH runs a leaking program (exit 23, dlpack-leak), and `pytest --capsan`
  (the pytest11 entry point) fails a leaky test and passes a clean one;
- `make install PREFIX=... PYTHON=/usr/bin/python3`: the package lands in the
  site directory sysconfig gives that python for PREFIX, the interpreter
  finds it there (and its plugin), and PREFIX/bin/capsan runs
  PREFIX/lib/libcapsan.so.

Which CPythons: the venvs .ci/venvs reports (build/venvs.txt, or the script
itself), each giving its base interpreter. `make test` installs into one
(cp311); `make test-install` sets CAPSAN_INSTALL_PYTHONS=all for every
CPython 3.10-3.13 there is; CAPSAN_INSTALL_PYTHONS=cp310,cp313 picks some.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import textwrap
from pathlib import Path

import pytest

from conftest import CAPSAN, CURRENT, DEFAULT_EXITCODE, LIBCAPSAN, ROOT, STATIC_PY, require

PIP_TIMEOUT = 900
RUN_TIMEOUT = 180

# A numpy export consumed through ctypes and never released: the consumer
# renames the capsule (so numpy's destructor leaves the tensor alone) and
# never calls the deleter. It prints which libcapsan.so the process mapped.
LEAK_PY = '''\
import ctypes

import numpy as np

api = ctypes.pythonapi
api.PyCapsule_GetPointer.restype = ctypes.c_void_p
api.PyCapsule_GetPointer.argtypes = [ctypes.py_object, ctypes.c_char_p]
api.PyCapsule_SetName.argtypes = [ctypes.py_object, ctypes.c_char_p]
USED = ctypes.create_string_buffer(b"used_dltensor")

cap = np.arange(8.0).__dlpack__()
managed = api.PyCapsule_GetPointer(cap, b"dltensor")  # consumed ...
api.PyCapsule_SetName(cap, USED)                      # ... and never deleted
del cap
with open("/proc/self/maps") as f:
    maps = {line.split()[-1] for line in f if line.rstrip().endswith("/libcapsan.so")}
print("runtime:", *sorted(maps), flush=True)
'''

TWO_TESTS = '''\
import ctypes
import numpy as np


def test_leaky():
    # a reference taken and lost, as a buggy extension does: never freed
    ctypes.pythonapi.Py_IncRef(ctypes.py_object(np.ones(1000)))


def test_clean():
    a = np.ones(100)
    assert np.from_dlpack(a).sum() == 100
'''


# ---- which CPythons ----------------------------------------------------------

def _stack() -> dict[str, Path]:
    """{tag: venv python} as .ci/venvs reports it (build/venvs.txt when
    `make venvs` wrote it, else the script itself)."""
    if CURRENT:
        return dict(CURRENT)
    cp = subprocess.run(["bash", str(ROOT / ".ci" / "venvs")], capture_output=True, text=True,
                        timeout=PIP_TIMEOUT, stdin=subprocess.DEVNULL)
    out = {}
    for line in cp.stdout.splitlines():
        parts = line.split(None, 1)
        if len(parts) == 2 and re.fullmatch(r"cp3\d+", parts[0]):
            out[parts[0]] = Path(parts[1])
    return out


def base_python(tag: str, venv_python: Path) -> Path:
    """The pyenv CPython a .ci/venvs venv was made from (pyvenv.cfg's home)."""
    cfg = venv_python.parent.parent / "pyvenv.cfg"
    home = None
    for line in cfg.read_text().splitlines():
        key, _, value = line.partition("=")
        if key.strip() == "home":
            home = Path(value.strip())
    assert home, f"no home in {cfg}"
    exe = home / f"python{tag[2]}.{tag[3:]}"
    assert exe.exists(), f"{exe} (the base of {venv_python}) is missing"
    return exe


def _selected() -> list:
    stack = _stack()
    if not stack:
        return [pytest.param(None, id="none")]
    want = os.environ.get("CAPSAN_INSTALL_PYTHONS", "").strip()
    if want == "all":
        tags = sorted(stack)
    elif want:
        tags = [t.strip() for t in want.split(",") if t.strip()]
    else:
        tags = ["cp311"] if "cp311" in stack else [sorted(stack)[-1]]
    return [pytest.param((t, stack.get(t)), id=t) for t in tags]


# ---- environment ----------------------------------------------------------------

def clean_env(bindir: Path | None = None) -> dict:
    """The caller's environment without anything that would find capsan for
    it: no PYTHONPATH, LD_PRELOAD, LD_LIBRARY_PATH, CAPSAN_*, venv or pytest
    settings; bindir first on PATH."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("CAPSAN_", "PYTEST_"))
           and k not in ("PYTHONPATH", "PYTHONHOME", "PYTHONSTARTUP", "LD_PRELOAD",
                         "LD_LIBRARY_PATH", "VIRTUAL_ENV", "PYTHONUSERBASE")}
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    env["OMP_NUM_THREADS"] = "1"
    if bindir is not None:
        env["PATH"] = f"{bindir}:{env.get('PATH', '/usr/bin:/bin')}"
    return env


def run(cmd, *, env, cwd=None, timeout=RUN_TIMEOUT):
    cp = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, env=env, cwd=cwd,
                        timeout=timeout, stdin=subprocess.DEVNULL)
    cp.describe = (f"command: {' '.join(map(str, cmd))}\nrc={cp.returncode}\n"
                   f"--- stdout\n{cp.stdout[-6000:]}\n--- stderr\n{cp.stderr[-6000:]}")
    return cp


# ---- pip install . ------------------------------------------------------------

BUILD_LEFTOVERS = ("_skbuild", "dist", "capsan.egg-info", "pyhook/capsan.egg-info")


@pytest.fixture(scope="module", params=_selected())
def pip_venv(request, tmp_path_factory):
    """A fresh venv of one pyenv CPython with numpy, pytest and this checkout
    (`pip install <repo>`). Returns the venv directory."""
    if request.param is None:
        pytest.skip("no pyenv CPython 3.10-3.13 on this machine (.ci/venvs found none)")
    tag, venv_python = request.param
    if venv_python is None:
        pytest.skip(f"no {tag} here (.ci/venvs reports {sorted(_stack())})")
    base = base_python(tag, venv_python)
    venv = tmp_path_factory.mktemp(f"venv-{tag}") / "v"
    env = clean_env()
    before = {p for p in BUILD_LEFTOVERS if (ROOT / p).exists()}
    for cmd in ([base, "-m", "venv", venv],
                [venv / "bin" / "python", "-m", "pip", "install", "-q", "--no-input",
                 "numpy", "pytest"],
                [venv / "bin" / "python", "-m", "pip", "install", "-q", "--no-input", ROOT]):
        cp = run(cmd, env=env, timeout=PIP_TIMEOUT)
        assert cp.returncode == 0, cp.describe
    after = {p for p in BUILD_LEFTOVERS if (ROOT / p).exists()}
    assert after <= before, f"pip install left {sorted(after - before)} in the checkout"
    return venv


def test_pip_install_files(pip_venv):
    """The wheel holds the package's sources, its dist-info, the tool and the
    runtime, and nothing else (no stale build/ output); the tool lands on the
    venv's PATH and the runtime in the venv's lib/."""
    site = next(pip_venv.glob("lib/python3.*/site-packages"))
    dist = site / "capsan-0.1.dist-info"
    record = [line.split(",")[0] for line in (dist / "RECORD").read_text().splitlines() if line]
    sources = {f"capsan/{p.name}" for p in (ROOT / "pyhook" / "capsan").glob("*.py")}
    natives = {os.path.relpath(pip_venv / "bin" / "capsan", site),
               os.path.relpath(pip_venv / "lib" / "libcapsan.so", site)}
    unexpected = [r for r in record
                  if r not in sources and r not in natives
                  and not r.startswith("capsan-0.1.dist-info/")
                  and not re.fullmatch(r"capsan/__pycache__/\w+\.cpython-3\d+(\.opt-\d)?\.pyc", r)]
    assert not unexpected, f"unexpected files in the wheel: {unexpected}"
    assert sources <= set(record), sorted(sources - set(record))
    assert natives <= set(record), (sorted(natives), record)
    assert "[pytest11]\ncapsan = capsan.pytest_plugin" in (dist / "entry_points.txt").read_text()
    assert os.access(pip_venv / "bin" / "capsan", os.X_OK)
    assert shutil.which("capsan", path=clean_env(pip_venv / "bin")["PATH"]) == \
        str(pip_venv / "bin" / "capsan")
    # the CMake build gives the CLI the package's version too
    v = run(["capsan", "--version"], env=clean_env(pip_venv / "bin"))
    assert v.returncode == 0 and v.stdout == "capsan 0.1\n", v.describe
    # `python -m capsan`: the same command, found beside the installed runtime
    v = run(["python", "-m", "capsan", "--version"], env=clean_env(pip_venv / "bin"))
    assert v.returncode == 0 and v.stdout == "capsan 0.1\n", v.describe


def test_pip_capsan_run(pip_venv, tmp_path):
    """`capsan run -- python leak.py` from the venv's PATH: the runtime the
    venv installed, a dlpack-leak report and exit status 23."""
    (tmp_path / "leak.py").write_text(LEAK_PY)
    env = clean_env(pip_venv / "bin")
    cp = run(["capsan", "run", "--log-path", tmp_path / "t", "--", "python", "leak.py"],
             env=env, cwd=tmp_path)
    assert cp.returncode == DEFAULT_EXITCODE, cp.describe
    assert "dlpack-leak" in cp.stderr, cp.describe
    assert f"runtime: {pip_venv / 'lib' / 'libcapsan.so'}\n" in cp.stdout, cp.describe
    traces = sorted(p for p in tmp_path.iterdir() if re.fullmatch(r"t\.\d+", p.name))
    assert traces, cp.describe
    rep = run(["capsan", "report", "--format", "json", *traces], env=env)
    assert rep.returncode == 0 and '"dlpack-leak"' in rep.stdout, rep.describe


def test_pip_pytest_plugin(pip_venv, tmp_path):
    """`pytest --capsan`: the plugin autoloads from the pytest11 entry point
    and binds the venv's runtime; the leaky test fails naming the kind, the
    clean one passes."""
    (tmp_path / "test_two.py").write_text(TWO_TESTS)
    env = clean_env(pip_venv / "bin")
    env["CAPSAN_OPTIONS"] = f"log_path={tmp_path / 't'}"
    cp = run(["pytest", "--capsan", "-p", "no:cacheprovider", "-rA", "test_two.py"],
             env=env, cwd=tmp_path)
    check_two_tests(cp)


def check_two_tests(cp):
    assert cp.returncode == 1, cp.describe
    assert re.search(r"^FAILED test_two\.py::test_leaky - capsan: numpy-leak", cp.stdout,
                     re.M), cp.describe
    assert re.search(r"^PASSED test_two\.py::test_clean$", cp.stdout, re.M), cp.describe
    assert "1 failed, 1 passed" in cp.stdout, cp.describe


# ---- make install ---------------------------------------------------------------

def make_install(prefix, destdir=""):
    require(CAPSAN, LIBCAPSAN, ROOT / "build" / "python" / "capsan" / "__init__.py")
    cp = run(["make", "-s", "-o", "all", "-C", ROOT, "install", f"PYTHON={STATIC_PY}",
              f"PREFIX={prefix}", f"DESTDIR={destdir}"], env=clean_env(), timeout=300)
    assert cp.returncode == 0, cp.describe
    return cp


def py_paths(prefix) -> dict:
    """What /usr/bin/python3 says about PREFIX: its scheme's purelib there,
    and the site directories it would search were PREFIX its prefix."""
    code = ("import json, site, sys, sysconfig; p = sys.argv[1]; print(json.dumps({"
            "'purelib': sysconfig.get_paths(vars={'base': p, 'platbase': p})['purelib'], "
            "'searched': site.getsitepackages([p])}))")
    cp = run([STATIC_PY, "-c", code, prefix], env=clean_env())
    assert cp.returncode == 0, cp.describe
    return json.loads(cp.stdout)


# site.addsitepackages is what site.py does at start-up for sys.prefix:
# PREFIX's site directories are searched as a python installed there would
WITH_PREFIX = "import site, sys; site.addsitepackages(set(), [sys.argv.pop(1)]); "


def test_make_install(tmp_path):
    """The package in sysconfig's purelib for PREFIX (one of the directories
    the interpreter searches for that prefix) with a dist-info carrying the
    pytest11 entry point and a RECORD; PREFIX/bin/capsan runs
    PREFIX/lib/libcapsan.so; `import capsan` and `pytest --capsan` work
    with PYTHONPATH unset."""
    prefix = tmp_path / "prefix"
    make_install(prefix)
    paths = py_paths(prefix)
    site = Path(paths["purelib"])
    assert str(site) in paths["searched"], paths
    assert (site / "capsan" / "__init__.py").exists(), sorted(map(str, prefix.rglob("*")))
    dist = site / "capsan-0.1.dist-info"
    assert "[pytest11]\ncapsan = capsan.pytest_plugin" in (dist / "entry_points.txt").read_text()
    record = (dist / "RECORD").read_text()
    for f in (prefix / "bin" / "capsan", prefix / "lib" / "libcapsan.so"):
        assert f.exists() and os.access(f, os.X_OK), f
        assert f"\n{os.path.relpath(f, site)},sha256=" in record, record
    assert not (prefix / "lib" / "capsan").exists(), "the old PREFIX/lib/capsan/python layout"
    env = clean_env()

    # the interpreter finds the package for that prefix, and the package the runtime
    code = WITH_PREFIX + textwrap.dedent('''
        import importlib.metadata as m
        import capsan
        print(capsan.__file__)
        print(capsan.library_path)
        print([e.value for e in m.entry_points(group="pytest11") if e.name == "capsan"])
    ''')
    cp = run([STATIC_PY, "-c", code, prefix], env=env, cwd=tmp_path)
    assert cp.returncode == 0, cp.describe
    assert cp.stdout.splitlines() == [str(site / "capsan" / "__init__.py"),
                                      str(prefix / "lib" / "libcapsan.so"),
                                      "['capsan.pytest_plugin']"], cp.describe

    # PREFIX/bin/capsan finds PREFIX/lib/libcapsan.so
    (tmp_path / "leak.py").write_text(LEAK_PY)
    cp = run([prefix / "bin" / "capsan", "run", "--log-path", tmp_path / "t", "--",
              STATIC_PY, "leak.py"], env=env, cwd=tmp_path)
    assert cp.returncode == DEFAULT_EXITCODE, cp.describe
    assert "dlpack-leak" in cp.stderr, cp.describe
    assert f"runtime: {prefix / 'lib' / 'libcapsan.so'}\n" in cp.stdout, cp.describe

    # pytest autoloads the plugin from the prefix's dist-info
    (tmp_path / "test_two.py").write_text(TWO_TESTS)
    env["CAPSAN_OPTIONS"] = f"log_path={tmp_path / 'p'}"
    code = WITH_PREFIX + "import pytest; sys.exit(pytest.main(sys.argv[1:]))"
    cp = run([STATIC_PY, "-c", code, prefix, "--capsan", "-p", "no:cacheprovider", "-rA",
              "test_two.py"], env=env, cwd=tmp_path)
    check_two_tests(cp)


def test_make_install_destdir(tmp_path):
    """DESTDIR stages the same tree; no installed file names the stage."""
    stage = tmp_path / "stage"
    prefix = "/opt/capsan-test"
    make_install(prefix, destdir=stage)
    site = Path(py_paths(prefix)["purelib"])
    root = stage / prefix.lstrip("/")
    assert (root / "bin" / "capsan").exists() and (root / "lib" / "libcapsan.so").exists()
    staged = stage / str(site).lstrip("/")
    assert (staged / "capsan" / "_lib.py").exists(), sorted(map(str, stage.rglob("*")))
    for f in stage.rglob("*"):
        if f.is_file():
            assert str(stage).encode() not in f.read_bytes(), f"{f} names the DESTDIR"
    assert not Path(prefix).exists()
