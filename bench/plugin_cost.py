"""What `pytest --capsan` costs against a plain pytest run and against
`capsan run -- pytest` (issue 36): CPU time (user + sys of the pytest
process and its children), the best of BENCH_REPEAT runs (3), the three
configurations interleaved. Targets: the plugin at most 1.5x plain and
1.25x `capsan run`. Run by hand (`make bench-plugin`), not a timed test:

    python3 bench/plugin_cost.py [numpy] [torch] [arro3]   # default: all three
    python3 bench/plugin_cost.py --build /other/build numpy  # another build's
                                         # runtime and package (before/after)

The suites (each skipped with a message when it cannot be had):

- numpy: numpy 2's own numpy/_core/tests/test_numeric.py (1,708 tests) in
  the venv BENCH_NUMPY_TAG (cp312) of `make venvs`; hypothesis, which it
  imports, from ~/.cache/capsan/np-test-deps/TAG, where
  tests/test_numpy_suites.py puts it (installed there once with pip);
- torch: torch's test/test_dlpack.py at the cp311 venv's torch release,
  obtained as tests/upstream_sources.py obtains it (or the file named by
  BENCH_TORCH_DLPACK), expecttest from the cache test_upstream_suites.py
  fills;
- arro3: arro3's tests/core in the Arrow cp311 venv (`make arrow-venvs`),
  from BENCH_ARRO3_TESTS (a folder holding tests/core) or a clone of
  kylebarron/arro3 in CAPSAN_UPSTREAM_GIT or /work/.mirror (its HEAD's
  tests: the venv has arro3-core 0.9.1, a clone may be older); test files
  that need a package the venv lacks fail to collect in every
  configuration alike.

Each configuration's pytest summary line is printed: the three must have
run the same tests. So are each configuration's range of runs and the
median of the rounds' own ratios: on a VM whose CPU time drifts, one
fast plain run moves a best-of ratio, and these show when it did.

`--real` (what `make bench` runs, issue 35 item 4): the DLPack and Arrow
suites of real libraries, best of BENCH_REPEAT (5 here) interleaved, with
the target <= 1.15x plain CPU for `capsan run` and for `pytest --capsan`:

- numpy-dlpack: numpy 2's numpy/_core/tests/test_dlpack.py (cp311 venv);
- pyarrow-cffi: pyarrow's pyarrow/tests/test_cffi.py (the Arrow cp311
  venv: its `_export_to_c`/`_import_from_c` round trips);
- torch-dlpack: torch's test/test_dlpack.py, as `torch` above."""
from __future__ import annotations

import os
import re
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
REPEAT = int(os.environ.get("BENCH_REPEAT", "3"))
EXPECTTEST = "expecttest==0.3.0"  # tests/test_upstream_suites.py's pin
MIRRORS = Path("/work/.mirror")


class Skip(Exception):
    pass


def listed(tag, listing):
    try:
        for line in (ROOT / "build" / listing).read_text().splitlines():
            parts = line.split(None, 1)
            if len(parts) == 2 and parts[0] == tag:
                return Path(parts[1].strip())
    except OSError:
        pass
    return None


def pip_target(py, req, d: Path) -> Path:
    """A folder with `req` for `py` (pip --target), made once."""
    if not any(d.glob("*.dist-info")):
        cp = subprocess.run([str(py), "-m", "pip", "install", "-q", "--disable-pip-version-check",
                             "--target", str(d), req], capture_output=True, text=True, timeout=600)
        if cp.returncode != 0:
            raise Skip(f"pip could not install {req} into {d}: {cp.stderr.strip()[-300:]}")
    return d


def numpy_tests(tag, name):
    """numpy 2's own numpy/_core/tests/NAME in the TAG venv, with hypothesis."""
    py = listed(tag, "venvs.txt")
    if py is None:
        raise Skip(f"no {tag} venv (make venvs)")
    cp = subprocess.run([str(py), "-c", "import numpy; print(numpy.__file__)"],
                        capture_output=True, text=True)
    test = Path(cp.stdout.strip()).parent / "_core" / "tests" / name
    if not test.exists():
        raise Skip(f"{test} is missing (numpy 2 installs its tests)")
    deps = []
    if subprocess.run([str(py), "-c", "import hypothesis"], capture_output=True).returncode:
        venvs = Path(os.environ.get("CAPSAN_VENVS") or Path.home() / ".cache/capsan/venvs")
        deps.append(pip_target(py, "hypothesis", venvs.parent / "np-test-deps" / tag))
    return f"numpy {tag} {name}", py, [str(test)], test.parent, deps


def numpy_suite():
    return numpy_tests(os.environ.get("BENCH_NUMPY_TAG", "cp312"), "test_numeric.py")


def torch_suite():
    import upstream_sources as us
    py = listed("cp311", "venvs.txt")
    if py is None:
        raise Skip("no cp311 venv (make venvs)")
    given = os.environ.get("BENCH_TORCH_DLPACK")
    if given:
        test = Path(given).resolve()
    else:
        try:
            test = us.obtain(us.TORCH, py) / "test" / "test_dlpack.py"
        except us.Unavailable as e:
            raise Skip(f"{e}\n  (or name a copy of test_dlpack.py in BENCH_TORCH_DLPACK)")
    deps = [pip_target(py, EXPECTTEST, us.CACHE / "deps" / "expecttest-cp311")]
    return "torch cp311 test_dlpack.py", py, [str(test)], test.parent, deps


def numpy_dlpack_suite():
    return numpy_tests("cp311", "test_dlpack.py")


def pyarrow_cffi_suite():
    py = listed("cp311", "arrowvenvs.txt")
    if py is None:
        raise Skip("no Arrow cp311 venv (make arrow-venvs)")
    cp = subprocess.run([str(py), "-c", "import pyarrow; print(pyarrow.__file__)"],
                        capture_output=True, text=True)
    test = Path(cp.stdout.strip()).parent / "tests" / "test_cffi.py"
    if not test.exists():
        raise Skip(f"{test} is missing (the pyarrow wheel ships its tests)")
    return "pyarrow cp311 test_cffi.py", py, [str(test)], test.parent, []


def arro3_suite(tmp: Path):
    py = listed("cp311", "arrowvenvs.txt")
    if py is None:
        raise Skip("no Arrow cp311 venv (make arrow-venvs)")
    given = os.environ.get("BENCH_ARRO3_TESTS")
    if given:
        top = Path(given)
    else:
        clones = [Path(p) for p in os.environ.get("CAPSAN_UPSTREAM_GIT", "").split(":") if p]
        clones += [MIRRORS]
        gits = [d for c in clones for d in (c, c / ".git", c / "kylebarron+arro3" / "repo")
                if (d / "HEAD").is_file()]
        top = tmp / "arro3"
        for g in gits:
            top.mkdir(exist_ok=True)
            arch = subprocess.run(["git", f"--git-dir={g}", "archive", "HEAD", "tests"],
                                  capture_output=True)
            if arch.returncode == 0:
                subprocess.run(["tar", "-x", "-C", str(top)], input=arch.stdout, check=True)
                break
    if not (top / "tests" / "core").is_dir():
        raise Skip("no arro3 tests: set BENCH_ARRO3_TESTS to a checkout of kylebarron/arro3")
    return ("arro3 tests/core (Arrow cp311)", py,
            ["tests/core", "--continue-on-collection-errors"], top, [])


def cpu_of(argv, env, cwd):
    """(CPU seconds of the run and its children, pytest's summary line)."""
    r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    cp = subprocess.run(argv, env=env, cwd=str(cwd), capture_output=True, text=True,
                        stdin=subprocess.DEVNULL)
    r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime)
    summary = [ln for ln in cp.stdout.splitlines() if re.search(r"\d+ (passed|failed|error)", ln)]
    line = summary[-1].strip("= ") if summary else f"(no summary, rc={cp.returncode})"
    # the wall-clock part varies with the machine's load, the counts do not
    return cpu, re.sub(r" in [\d.]+s.*$", "", line)


def measure(suite, build: Path, tmp: Path, real=False):
    label, py, args, cwd, deps = suite
    base = dict(os.environ)
    for k in ("LD_PRELOAD", "CAPSAN_OPTIONS", "PYTHONPATH", "PYTEST_ADDOPTS",
              "PYTEST_DISABLE_PLUGIN_AUTOLOAD"):
        base.pop(k, None)
    base["OMP_NUM_THREADS"] = "1"
    pytest = [str(py), "-m", "pytest", "-q", "-p", "no:cacheprovider", *args]
    paths = ":".join(map(str, deps))
    configs = {
        "plain": (pytest, {"PYTHONPATH": paths}),
        "capsan run": ([str(build / "bin" / "capsan"), "run", "--log-path", str(tmp / "run"),
                        "--", *pytest], {"PYTHONPATH": paths}),
        "pytest --capsan": ([*pytest, "--capsan"],
                            {"PYTHONPATH": ":".join(filter(None, [str(build / "python"), paths])),
                             "CAPSAN_OPTIONS": f"log_path={tmp / 'plugin'}"}),
    }
    best = {k: None for k in configs}
    lines = {k: set() for k in configs}
    rounds = []
    for _ in range(REPEAT):
        this = {}
        for name, (argv, extra) in configs.items():
            cpu, line = cpu_of(argv, {**base, **extra}, cwd)
            this[name] = cpu
            best[name] = cpu if best[name] is None else min(best[name], cpu)
            lines[name].add(line)
        rounds.append(this)
    plain, run, plug = best["plain"], best["capsan run"], best["pytest --capsan"]
    print(f"{label}: CPU seconds, best of {REPEAT}")
    for name in configs:
        spread = [r[name] for r in rounds]
        print(f"  {name:16s} {best[name]:7.2f}s   (runs {min(spread):.2f}-{max(spread):.2f}s)   "
              f"{' | '.join(sorted(lines[name]))}")
    # this VM's CPU time drifts by phases (one suite's plain runs: 2.3-3.0 s
    # in a row); the ratio within each round, taken minutes apart from
    # the others, shows how far the best-of ratios below can be trusted
    for name in configs:
        if name == "plain":
            continue
        per = sorted(r[name] / r["plain"] for r in rounds)
        print(f"  {name} / plain within each round: median {statistics.median(per):.2f}x "
              f"({per[0]:.2f}-{per[-1]:.2f}x)")
    targets = ((("capsan run / plain ", run / plain, 1.15), ("plugin / plain     ", plug / plain, 1.15))
               if real else
               (("plugin / plain     ", plug / plain, 1.5), ("plugin / capsan run", plug / run, 1.25)))
    for what, ratio, target in targets:
        verdict = "met" if ratio <= target else "MISSED"
        print(f"  {what} {ratio:5.2f}x  (target <= {target}x: {verdict})")
    if not real:
        print(f"  capsan run / plain  {run / plain:5.2f}x")
    if len({frozenset(v) for v in lines.values()}) > 1:
        print("  note: the configurations' pytest outcomes differ (above)")


def main(argv):
    global REPEAT
    build = ROOT / "build"
    if argv[:1] == ["--build"]:
        build, argv = Path(argv[1]).resolve(), argv[2:]
    real = argv[:1] == ["--real"]
    if real:
        argv = argv[1:]
        REPEAT = int(os.environ.get("BENCH_REPEAT", "5"))
    want = argv or (["numpy-dlpack", "pyarrow-cffi", "torch-dlpack"] if real
                    else ["numpy", "torch", "arro3"])
    tmp = Path(tempfile.mkdtemp(prefix="capsan-plugin-cost-"))
    try:
        for name in want:
            suites = {"numpy": numpy_suite, "torch": torch_suite, "torch-dlpack": torch_suite,
                      "arro3": lambda: arro3_suite(tmp), "numpy-dlpack": numpy_dlpack_suite,
                      "pyarrow-cffi": pyarrow_cffi_suite}
            if name not in suites:
                sys.exit(f"unknown suite {name!r}: {', '.join(suites)}")
            try:
                suite = suites[name]()
            except Skip as e:
                print(f"{name}: skipped: {e}")
                continue
            measure(suite, build, tmp, real)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main(sys.argv[1:])
