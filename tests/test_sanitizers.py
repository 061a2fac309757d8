"""capsan under the sanitizers (docs/hardening.md).

- The runtime built with UBSan (build/ubsan/lib/libcapsan.so, made by
  `make sanitizers`) runs every DLPack and NumPy scenario of the fuzzer's
  seed list (tests/fuzz/seeds.py RUNS) through `build/ubsan/bin/capsan run`,
  itself the CLI built with ASan+UBSan. Both are built with
  -fno-sanitize-recover=all, so any report ends the process: a test fails
  on any "runtime error" or sanitizer report on stderr.
- The same ASan+UBSan CLI then reports each run's traces in every format
  (text, JSON, HTML, --gen-suppressions); its JSON must equal the plain
  CLI's.
- The runtime built with ASan (build/asan/lib/libcapsan.so, libasan
  preloaded first) runs the same scenarios under `make asan` only
  (CAPSAN_SAN_ASAN=1). ASan's leak checker is off there (detect_leaks=0):
  the interpreter never frees its own startup allocations, so every run
  would "leak" thousands of objects that are not capsan's.
"""
import json
import os
import subprocess
import sys
import pytest

from conftest import BUILD, TESTS, capsan_report

sys.path.insert(0, str(TESTS / "fuzz"))
import seeds  # noqa: E402

ASAN_CLI = BUILD / "asan" / "bin" / "capsan"
UBSAN_CLI = BUILD / "ubsan" / "bin" / "capsan"   # a copy of ASAN_CLI: it finds ../lib
UBSAN_LIB = BUILD / "ubsan" / "lib" / "libcapsan.so"
ASAN_LIB = BUILD / "asan" / "lib" / "libcapsan.so"
SAN_ENV = {
    "UBSAN_OPTIONS": "print_stacktrace=1",
    "ASAN_OPTIONS": "detect_leaks=1:abort_on_error=0",
}
# the scenario's own memory error, which ASan (on the program's malloc)
# catches before glibc would: capsan's finding must be on stderr first
PROGRAM_BUGS = {
    "np_foreign_abort": ("attempting free on address which was not malloc()-ed",
                         "numpy-foreign-free"),
    "np_double_free": ("attempting double-free", "numpy-double-free"),
}
# a program that dies of SIGSEGV: capsan's crash handler reports the
# finding, so it runs instead of ASan's (handle_segv=0), as it would natively
CRASH_HANDLER = {"null_deleter_crash": "dlpack-null-deleter"}


def sanitizer_reports(text: str) -> list[str]:
    marks = ("runtime error:", "ERROR: AddressSanitizer", "ERROR: LeakSanitizer",
             "ERROR: UndefinedBehaviorSanitizer")
    return [ln for ln in text.splitlines() if any(m in ln for m in marks)]


def require_san():
    """Fail (never skip) without the sanitizer builds (make test makes them)."""
    missing = [str(p) for p in (ASAN_CLI, UBSAN_CLI, UBSAN_LIB, ASAN_LIB) if not p.exists()]
    if missing:
        pytest.fail("sanitizer build(s) missing: " + ", ".join(missing)
                    + " -- run `make sanitizers`", pytrace=False)


@pytest.mark.parametrize("name", list(seeds.RUNS))
def test_ubsan_runtime_and_asan_cli(tmp_path, name):
    require_san()
    # the ASan CLI's `capsan run` preloads the UBSan runtime beside it
    cp, traces = seeds.run_one(name, tmp_path, capsan=UBSAN_CLI, extra_env=SAN_ENV)
    bad = sanitizer_reports(cp.stderr)
    assert not bad, f"{name}: sanitizer report\n{cp.stderr[-6000:]}"
    assert traces, f"{name}: no trace (exit {cp.returncode})\n{cp.stderr[-3000:]}"
    # the plain CLI's JSON is what the sanitized one must print
    plain, want = capsan_report(traces)
    assert want["processes"] and all(p["trace"] for p in want["processes"])
    for fmt in ("text", "json", "html", "gen"):
        args = ["--gen-suppressions"] if fmt == "gen" else ["--format", fmt]
        r = subprocess.run([str(ASAN_CLI), "report", *args, *map(str, traces)],
                           capture_output=True, text=True, timeout=120,
                           env={**os.environ, **SAN_ENV})
        bad = sanitizer_reports(r.stderr)
        assert not bad, f"{name} ({fmt}): sanitizer report\n{r.stderr[-6000:]}"
        assert r.returncode == plain.returncode, (fmt, r.returncode, r.stderr[-2000:])
        if fmt == "json":
            assert json.loads(r.stdout) == want, f"{name}: the ASan CLI's JSON differs"
        elif fmt == "html":
            assert r.stdout.rstrip().endswith("</html>"), r.stdout[-300:]


@pytest.mark.skipif(not os.environ.get("CAPSAN_SAN_ASAN"),
                    reason="the runtime under ASan runs in `make asan`")
@pytest.mark.parametrize("name", list(seeds.RUNS))
def test_asan_runtime(tmp_path, name):
    require_san()
    libasan = subprocess.run(["gcc", "-print-file-name=libasan.so"], capture_output=True,
                             text=True).stdout.strip()
    env = {"UBSAN_OPTIONS": "print_stacktrace=1",
           "ASAN_OPTIONS": "detect_leaks=0" + (":handle_segv=0" if name in CRASH_HANDLER else "")}
    cp, traces = seeds.run_one(name, tmp_path, lib=ASAN_LIB, preload_first=libasan,
                               extra_env=env)
    bad = sanitizer_reports(cp.stderr)
    if name in PROGRAM_BUGS:
        what, kind = PROGRAM_BUGS[name]
        assert len(bad) == 1 and what in cp.stderr, f"{name}\n{cp.stderr[-6000:]}"
        assert kind in cp.stderr.split(bad[0])[0], (
            f"{name}: capsan's {kind} must be reported before ASan stops the program\n"
            + cp.stderr[-6000:])
    else:
        assert not bad, f"{name}: sanitizer report\n{cp.stderr[-6000:]}"
    if name in CRASH_HANDLER:
        assert cp.returncode == -11 and f"ERROR: capsan: {CRASH_HANDLER[name]}" in cp.stderr, (
            f"{name}: exit {cp.returncode}\n{cp.stderr[-6000:]}")
    assert traces, f"{name}: no trace (exit {cp.returncode})\n{cp.stderr[-3000:]}"


# The exchange API on the current stack (torch 2.13, tvm-ffi: its wheels'
# libraries, some without a build id) under the UBSan runtime
XAPI_RUNS = {
    "xk_" + m: ("xk_kernels.py", m) for m in
    ("clean", "leak", "double_delete", "nogil", "bad_tensor", "stale_view", "data_freed",
     "deleter_nogil")
}
XAPI_RUNS.update({"xp_" + m: ("xp_producers.py", m) for m in
                  ("clean", "from_py_no_error", "alloc_no_seterror", "heap_table")})
XAPI_RUNS["xapi_clean"] = ("xapi_clean.py", "all")


@pytest.mark.parametrize("name", list(XAPI_RUNS))
def test_ubsan_runtime_exchange_api(tmp_path, name):
    from conftest import SCENARIOS, current_python, findings, run_capsan, summarize
    require_san()
    py = current_python("cp311")
    script, mode = XAPI_RUNS[name]
    args = [mode, 20] if script == "xapi_clean.py" else [mode]
    res = run_capsan(SCENARIOS / script, tmp_path, interpreter=py, mode="preload",
                     lib=UBSAN_LIB, options=["protect=1"], args=args, timeout=300,
                     env={**SAN_ENV, "CAPSAN_XAPI_BUILD": str(BUILD / "tests" / "xapi-kernels")})
    bad = sanitizer_reports(res.stderr)
    assert not bad, f"{name}: sanitizer report\n{res.stderr[-6000:]}"
    assert "ok" in res.stdout, res.describe()
    assert bool(findings(res.report)) == ("clean" not in name), summarize(res.report)
