"""Arrow structs handed over by address, no capsule (issue 33, R49):
libarrow's export and import functions under pyarrow's _export_to_c /
_import_from_c, followed with the capsule path's records. The arrowaddr
fixture (a database driver in C) commits one bug each, reported at its
Python line, also when capsan never saw the driver export its stream; the
correct exchanges and pyarrow's own test_cffi.py report nothing. On the
pinned Arrow venvs (CPython 3.11 and 3.13, make arrow-venvs)."""
import signal

import pytest

from conftest import (DEFAULT_EXITCODE, FIXDIR, SCENARIOS, assert_finding_at, findings, is_signal,
                      kinds, require, run_capsan, tagged_pythons)

S = SCENARIOS / "ar_byaddr.py"


@pytest.fixture
def apy(apy_tag):
    # the fixture is built for the same CPython by make fixtures-current
    py, tag = apy_tag
    fix = FIXDIR / tag
    require(fix / "arrowaddr.so")
    return py, fix


def run(tmp_path, apy, case, options=()):
    py, fix = apy
    return run_capsan(S, tmp_path, interpreter=py, args=[case], options=list(options),
                      env={"PYTHONPATH": str(fix)})


def only(res, expected):
    assert kinds(res.report) == set(expected), res.describe()


def event_names(f):
    return [e["event"] for e in f["events"]]


def test_clean_exchanges(tmp_path, apy):
    """A result set imported by pyarrow, parameters exported into the
    driver's buffers and released by it, a round trip: nothing to say, and
    the structs were followed (their births counted)."""
    res = run(tmp_path, apy, "clean")
    assert res.returncode == 0 and "done" in res.stdout, res.describe()
    assert findings(res.report) == [], res.describe()
    assert "Arrow structs watched" in res.stderr and " 0 Arrow structs" not in res.stderr, \
        res.stderr[-2000:]


def test_leak_exported_never_released(tmp_path, apy):
    """The driver binds parameters pyarrow exported into its buffer and
    never releases them; the next export overwrites the buffer."""
    res = run(tmp_path, apy, "leak")
    assert res.returncode == DEFAULT_EXITCODE and "bound" in res.stdout, res.describe()
    f = assert_finding_at(res, "arrow-leak", S, "export-loop", event="export-by-address")
    assert f["object"]["type"] in ("ArrowArray", "ArrowSchema"), f["object"]
    assert "never imported or released" in f["message"], f["message"]
    only(res, ["arrow-leak"])


def test_double_release_copy_not_move(tmp_path, apy):
    """The driver copies the array instead of moving it and releases both:
    reported before the second release runs (protect=1 skips it)."""
    res = run(tmp_path, apy, "double-release", ["protect=1"])
    assert res.returncode == DEFAULT_EXITCODE and "done" in res.stdout, res.describe()
    f = assert_finding_at(res, "arrow-double-release", S, "bind", event="release",
                          innermost=False)
    assert event_names(f).count("release") == 2, event_names(f)
    assert_finding_at(res, "arrow-double-release", S, "export", event="export-by-address")
    only(res, ["arrow-double-release"])


def test_release_not_cleared_before_pyarrow_aborts(tmp_path, apy):
    """The driver's stream release leaves release set; pyarrow's reader,
    releasing it, checks and aborts: the finding comes first, with the line
    that dropped the reader, and the stream's life from the import on (the
    driver's export was never seen)."""
    res = run(tmp_path, apy, "not-cleared")
    assert is_signal(res.returncode, signal.SIGABRT), res.describe()
    assert "survived" not in res.stdout
    f = assert_finding_at(res, "arrow-release-not-cleared", S, "drop-not-cleared", event="release")
    assert f["object"]["type"] == "ArrowArrayStream", f["object"]
    assert event_names(f)[:2] == ["export-by-address", "import-by-address"], event_names(f)
    assert_finding_at(res, "arrow-release-not-cleared", S, "import", event="import-by-address",
                      innermost=False)
    # the producer capsan never saw export: named from its release callback
    assert "its producer: arrowaddr" in res.stderr and "stream_release" in res.stderr, \
        res.stderr[-3000:]


def test_use_after_release_through_stale_copy(tmp_path, apy):
    """arrow-adbc #4363's shape: the driver asks the struct pyarrow moved
    the stream out of for its last error after pyarrow released it."""
    res = run(tmp_path, apy, "use-after-release")
    f = assert_finding_at(res, "arrow-use-after-release", S, "stale", event="get-last-error")
    assert "stale copy" in f["message"], f["message"]
    assert_finding_at(res, "arrow-use-after-release", S, "drop-used", event="release")
    assert "import-by-address" in event_names(f), event_names(f)
    only(res, ["arrow-use-after-release"])


def test_stream_misuse_prefetch_thread(tmp_path, apy):
    """The driver's prefetch thread reads the stream pyarrow owns, while
    pyarrow reads it."""
    res = run(tmp_path, apy, "misuse")
    assert res.returncode == DEFAULT_EXITCODE and "done" in res.stdout, res.describe()
    f = assert_finding_at(res, "arrow-stream-misuse", S, "import", event="import-by-address",
                          innermost=False)
    assert f["object"]["type"] == "ArrowArrayStream", f["object"]
    only(res, ["arrow-stream-misuse"])


def test_bad_struct_import_of_empty_stream(tmp_path, apy):
    """The query failed and the driver handed over the stream unfilled:
    pyarrow refuses it; capsan names the line that imported it."""
    res = run(tmp_path, apy, "bad-struct")
    assert "refused" in res.stdout and "done" in res.stdout, res.describe()
    f = assert_finding_at(res, "arrow-bad-struct", S, "import-empty")
    assert f["object"]["type"] == "ArrowArrayStream", f["object"]
    assert "imported by address with release == NULL" in f["message"], f["message"]
    only(res, ["arrow-bad-struct"])


# pyarrow's test_cffi.py leaks two structs on purpose: it exports a device
# array to check its fields and never releases it, and imports one whose
# device_type it rewrote, which pyarrow refuses before moving it. Both are
# real leaks (exported by address, never imported or released); any other
# finding is not.
CFFI_OWN_LEAKS = ("test_export_import_device_array", "test_import_device_no_cuda")


def own_leak(f):
    if f["kind"] != "arrow-leak":
        return False
    frames = [fr.get("function", "") for e in f["events"] for fr in e.get("stack", [])]
    return any(name in CFFI_OWN_LEAKS for name in frames)


@pytest.mark.parametrize("mode", ["run", "plugin"])
def test_pyarrow_test_cffi_clean(tmp_path, apy, mode):
    """pyarrow's own tests of _export_to_c/_import_from_c pass as many
    tests under capsan as natively, and capsan finds nothing but the two
    leaks the suite commits on purpose."""
    import subprocess
    from conftest import BUILD
    py, fix = apy
    site = subprocess.run([str(py), "-c", "import pyarrow, os; print(os.path.dirname(pyarrow.__file__))"],
                          capture_output=True, text=True, check=True).stdout.strip()
    suite = f"{site}/tests/test_cffi.py"
    args = ["-q", "-p", "no:cacheprovider", suite]
    native = subprocess.run([str(py), "-m", "pytest", *args], capture_output=True, text=True)
    passed = [l for l in native.stdout.splitlines() if " passed" in l]
    assert native.returncode == 0 and passed, native.stdout[-2000:]
    if mode == "plugin":
        args.insert(0, "--capsan")
    code = "import sys, pytest; sys.exit(pytest.main(%r))" % (args,)
    res = run_capsan(code, tmp_path, interpreter=py, timeout=600,
                     env={"PYTHONPATH": str(BUILD / "python")})
    counts = passed[-1].split(" in ")[0]
    assert counts in res.stdout, (counts, res.stdout[-2000:])
    bad = [f for f in findings(res.report) if not own_leak(f)]
    assert bad == [], res.describe()


def test_describe_an_address(tmp_path, apy):
    """capsan.describe(int): the struct capsan follows there, its fields,
    its producer (also once moved out: the record keeps its release) and
    where it stands; at an address capsan follows nothing at, describe
    refuses the int as before."""
    import json
    from conftest import BUILD
    py, fix = apy
    res = run_capsan(S, tmp_path, interpreter=py, args=["describe"],
                     env={"PYTHONPATH": f"{BUILD / 'python'}:{fix}"})
    ds = [json.loads(line) for line in res.stdout.splitlines() if line.startswith("{")]
    assert len(ds) == 3, res.describe()
    stream, arr, sch = ds
    assert stream["followed"] and stream["capsules"][0]["name"] == "ArrowArrayStream"
    assert stream["capsules"][0]["producer"].startswith("arrowaddr"), stream
    assert "moved out" in stream["state"], stream["state"]
    assert arr["capsules"][0]["struct"]["length"] == 3 and arr["capsules"][0]["released"] is False
    assert "handed over by address, live" in arr["state"], arr["state"]
    assert arr["capsules"][0]["producer"].startswith("libarrow"), arr
    assert sch["capsules"][0]["struct"]["format"] == "l"
    assert "unknown: describe() takes" in res.stdout and "Arrow struct capsan follows" in res.stdout
    assert "followed by capsan: handed over by address" in res.stderr, res.stderr[-2000:]
    assert findings(res.report) == [], res.describe()


ADBC = tagged_pythons("adbcvenvs.txt")


@pytest.mark.parametrize("case,least", [("adbc", 10), ("engines", 30)])
@pytest.mark.parametrize("tag", ["cp311", "cp313"])
def test_real_libraries_by_address_clean(tmp_path, tag, case, least):
    """ADBC's driver manager with its SQLite driver (pinned, make
    adbc-venvs: query results handed to pyarrow by address, a table
    ingested), duckdb's result readers and scans of pyarrow data, and
    polars to and from pyarrow report nothing. The structs they trade by
    address were followed: capsule hooks alone see 3 (adbc) and 21
    (engines) in these runs."""
    import re
    if tag not in ADBC:
        pytest.skip(f"no ADBC {tag} venv (make adbc-venvs; .ci/adbcvenvs)")
    script = SCENARIOS / "ar_addr_peers.py"
    res = run_capsan(script, tmp_path, interpreter=ADBC[tag], args=[case], timeout=300)
    assert res.returncode == 0 and f"{case} ok" in res.stdout, res.describe()
    assert findings(res.report) == [], res.describe()
    m = re.search(r"(\d+) Arrow structs? watched", res.stderr)
    assert m and int(m.group(1)) >= least, res.stderr[-2000:]
