"""A late start changes nothing (issue 36): capsan started by `import capsan`
after the program loaded its modules must leave every allocator pair the
program already holds matched. The proof is code nobody here wrote:
CPython's own tests of its extension modules, run in one process with
those modules imported first and capsan started after them
(stdlib_late.py), must count exactly what they count natively, on every
CPython 3.10-3.13 the machine has (Debian's python ships no test package).
"""
import json
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import CURRENT, ROOT, TESTS, base_env, require_runtime

DRIVER = TESTS / "stdlib_late.py"
MODULES = ["test_decimal", "test_array", "test_struct", "test_json", "test_zlib",
           "test_ctypes", "test_sqlite3", "test_pickle", "test_hashlib", "test_bz2",
           "test_lzma", "test_xml_etree_c", "test_pyexpat", "test_csv", "test_datetime"]
TAGS = ["cp310", "cp311", "cp312", "cp313"]


def run_driver(py: Path, *args: str) -> subprocess.CompletedProcess:
    env = base_env(interpreter=py)
    env["PYTHONPATH"] = str(ROOT / "build" / "python")
    return subprocess.run([str(py), str(DRIVER), *args], env=env, capture_output=True,
                          text=True, timeout=600, cwd=str(TESTS))


def counts(res: subprocess.CompletedProcess) -> dict:
    assert res.returncode == 0, f"status {res.returncode}\n{res.stderr[-3000:]}"
    return json.loads(res.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("tag", TAGS)
def test_stdlib_suites_after_a_late_start(tag):
    require_runtime()
    if tag not in CURRENT:
        pytest.skip(f"no {tag} venv on this machine (make venvs)")
    py = CURRENT[tag]
    native = counts(run_driver(py, "--native", *MODULES))
    late = counts(run_driver(py, *MODULES))
    assert late == native
    # the suites did run: decimal's C tests alone are hundreds
    assert native["test_decimal"][0] > 300


SUM = "print(sum(decimal.Decimal(i) / 7 for i in range(2000)))"


def decimal_work(prelude: str) -> None:
    """Decimal work after `prelude` in Debian's python3: it must finish with
    the right sum (a mismatched allocator pair aborts it)."""
    require_runtime()
    env = base_env(interpreter=sys.executable)
    env["PYTHONPATH"] = str(ROOT / "build" / "python")
    res = subprocess.run(["/usr/bin/python3", "-c", f"{prelude}; {SUM}"], env=env,
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == "285571.4285714285714285714286"


@pytest.mark.parametrize("first", ["decimal", "capsan"])
def test_decimal_work_either_order(first):
    """The one-liner of issue 36: _decimal keeps PyMem_Free in libmpdec's
    mpd_free, set at its import; a start after it must not rewrite that
    variable back to the hook of free()."""
    order = "import decimal; import capsan" if first == "decimal" else \
        "import capsan; import decimal"
    decimal_work(f"{order}; assert capsan.active()")


def test_stop_keeps_what_the_program_wrote():
    """capsan.stop() restores the slots it wrote, but not a data slot the
    program wrote since: _decimal imported after the start sets mpd_free
    itself, and the restore must not put free() back there."""
    decimal_work("import capsan, decimal; capsan.stop()")
