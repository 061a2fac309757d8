"""Real capsan traces for the fuzzer's seed corpus (make fuzz).

    python3 tests/fuzz/seeds.py OUTDIR

runs every scenario of RUNS under build/bin/capsan run (Debian's
/usr/bin/python3, the fixtures of build/tests), so that each finding kind,
every way a process ends (exit, signal, halt_on_error, SIGKILL: no END
record) and a forked child are in the corpus. Each trace is cut at its end
of data (a trace file is 8 MiB, mostly a sparse tail) and written to
OUTDIR/NAME.N; a few are also written truncated (in the header, in the
middle of a record, at a record boundary), a parent and child back to back
(the fuzz target splits its input at each trace header), and one with a
suppressions file after the marker the target looks for. One seed is no
trace: the JSON report of `pytest --capsan --capsan-report=PATH`, which
`capsan report` renders too.

tests/test_sanitizers.py imports RUNS and run_one() to run a selection of
the same scenarios under the UBSan runtime and to report their traces
with the ASan CLI.
"""
from __future__ import annotations

import os
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
BUILD = ROOT / "build"
SCEN = ROOT / "tests" / "scenarios"
PYTHON = "/usr/bin/python3"
SUPP_MARK = b"\n#capsan-fuzz-suppressions\n"

# name: (scenario, args, CAPSAN_OPTIONS); every finding kind is here
RUNS = {
    "double_delete": ("dl_double_delete.py", ["legacy"], "protect=1"),
    "double_delete_v": ("dl_double_delete.py", ["versioned"], "protect=1"),
    "bad_ndim": ("dl_bad_tensor.py", ["ndim"], ""),
    "bad_unreadable": ("dl_bad_tensor.py", ["unreadable"], ""),
    "bad_version": ("dl_bad_tensor.py", ["version_major"], ""),
    "bad_flags": ("dl_bad_tensor.py", ["flags"], ""),
    "mutated_producer": ("dl_mutated.py", ["producer"], ""),
    "mutated_consumer": ("dl_mutated.py", ["consumer"], ""),
    "byte_offset": ("dl_byte_offset.py", ["object"], ""),
    "unchecked_leak": ("dl_unchecked.py", ["consume_leak"], ""),
    "unchecked_good": ("dl_unchecked.py", ["consume_good"], "protect=1"),
    "not_renamed": ("dl_not_renamed.py", [], "protect=1"),
    "reconsume": ("dl_reconsume.py", [], ""),
    "leak_consumed": ("dl_leak.py", ["consumed", "3"], "max_findings=1"),
    "leak_no_destructor": ("dl_leak.py", ["no_destructor"], ""),
    "null_deleter": ("dl_null_deleter.py", ["checked"], ""),
    "null_deleter_crash": ("dl_null_deleter.py", ["crash"], ""),
    "device_mismatch": ("dl_device_mismatch.py", [], ""),
    "halt": ("dl_halt.py", [], "halt_on_error=1"),
    "nogil_capsule": ("gil_calls.py", ["capsule"], ""),
    "nogil_deleter": ("gil_calls.py", ["deleter"], ""),
    "np_leak": ("np_leak.py", ["exit"], ""),
    "np_foreign_abort": ("np_owndata.py", ["offset16"], ""),
    "np_foreign": ("np_owndata.py", ["exact"], ""),
    "np_double_free": ("np_owndata.py", ["double"], ""),
    "np_stale_swap": ("np_stale.py", ["swap"], ""),
    "np_stale_struct": ("np_stale.py", ["struct"], ""),
    "np_stale_ctx": ("np_stale.py", ["ctx"], ""),
    "np_bad_handler": ("np_bad_handler.py", ["v2"], ""),
    "np_bad_handler_name": ("np_bad_handler.py", ["unterminated"], ""),
    "np_nogil": ("np_nogil_numpy.py", [], ""),
    "fork": ("clean_fork.py", [], "record_all=1"),
    "killed": ("dl_killed.py", [], "protect=1"),   # SIGKILLed: no END record
    # tensors judged on their thread (young_dl.c) that leave it: a leak on
    # a thread that ended, a double delete among clean exchanges, a loan
    # released on another thread
    "thread_leak": ("dl_threads.py", ["leak"], ""),
    "thread_double": ("dl_threads.py", ["double"], "protect=1"),
    "thread_mutated": ("dl_threads.py", ["mutated"], ""),
    # several findings of a kind, from one stack and from others: leak
    # groups, max_findings, --gen-suppressions' distinct lines
    "many": ("inline:many", [], "protect=1:max_findings=4"),
}

# scenarios written here rather than in tests/scenarios ("inline:NAME")
INLINE = {
    "many": (
        "import numpy as np, dlconsumer as C, dlproducer as P, np_leaky as L\n"
        "def leak(n):\n"
        "    C.consume_leak(P.good(n))\n"
        "for i in range(5):\n"
        "    leak(4 + i)\n"
        "for i in range(3):\n"
        "    C.consume_versioned_leak(P.versioned(8))\n"
        "for i in range(4):\n"
        "    C.double_delete(P.good(4))\n"
        "C.consume_twice(P.good(4))\n"
        "for i in range(3):\n"
        "    L.keep_forever(np.ones(100 + i))\n"
    ),
}


def env() -> dict:
    e = dict(os.environ)
    for k in ("LD_PRELOAD", "CAPSAN_OPTIONS", "PYTHONHOME", "PYTHONSTARTUP"):
        e.pop(k, None)
    e["PYTHONPATH"] = f"{BUILD / 'tests'}:{BUILD / 'python'}"
    e["PYTHONDONTWRITEBYTECODE"] = "1"
    e["OMP_NUM_THREADS"] = "1"
    return e


def data_end(blob: bytes) -> int:
    """Offset of the end of data: the first zero record header, or where
    the framing stops making sense (the reader reports the rest)."""
    if len(blob) < 64 or blob[:8] != b"CAPSANTR":
        return len(blob)
    off = struct.unpack_from("<I", blob, 12)[0]
    while off + 8 <= len(blob):
        typ, _flags, size = struct.unpack_from("<HHI", blob, off)
        if typ == 0 and size == 0:
            return off
        if size < 8 or size % 8 or off + size > len(blob):
            return len(blob)
        off += size
    return min(off, len(blob))


def trimmed(path: Path) -> bytes:
    blob = path.read_bytes()
    return blob[:data_end(blob)]


def no_core():
    """preexec_fn: crashing scenarios leave no core files behind."""
    import resource
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))


def trace_files(tmp: Path) -> list[Path]:
    return sorted(p for p in tmp.iterdir() if p.name.startswith("t.") and p.name[2:].isdigit())


def run_one(name: str, tmp: Path, *, capsan: Path = BUILD / "bin" / "capsan",
            lib: Path | None = None, preload_first: str = "", extra_env: dict | None = None,
            timeout: int = 120) -> tuple[subprocess.CompletedProcess, list[Path]]:
    """Run RUNS[name] with `capsan run` (the CLI at capsan); returns the
    process and its trace files TMP/t.PID. With lib, the runtime is
    LD_PRELOADed from there instead, after preload_first (a sanitizer's
    runtime), with log_path in CAPSAN_OPTIONS."""
    script, args, opts = RUNS[name]
    tmp.mkdir(parents=True, exist_ok=True)
    prefix = tmp / "t"
    e = env()
    if extra_env:
        e.update(extra_env)
    path = SCEN / script
    if script.startswith("inline:"):
        path = tmp / (script[len("inline:"):] + ".py")
        path.write_text(INLINE[script[len("inline:"):]])
    argv = [PYTHON, str(path), *args]
    if lib is None:
        cmd = [str(capsan), "run", "--keep-trace", "--log-path", str(prefix), "--", *argv]
        if opts:
            e["CAPSAN_OPTIONS"] = opts
    else:
        cmd = argv
        e["LD_PRELOAD"] = ":".join(filter(None, [preload_first, str(lib)]))
        e["CAPSAN_OPTIONS"] = ":".join(filter(None, [f"log_path={prefix}", "keep_trace=always", opts]))
    if name == "killed":
        # SIGKILLed once it is ready: a trace without an END record
        p = subprocess.Popen(cmd, env=e, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             stdin=subprocess.DEVNULL, text=True)
        line = p.stdout.readline()
        # the python process is capsan run's child (or p itself, preloaded)
        kids = subprocess.run(["pgrep", "-P", str(p.pid)], capture_output=True, text=True)
        for pid in [int(x) for x in kids.stdout.split()] or [p.pid]:
            os.kill(pid, signal.SIGKILL)
        out, err = p.communicate(timeout=timeout)
        cp = subprocess.CompletedProcess(cmd, p.returncode, line + out, err)
    else:
        cp = subprocess.run(cmd, env=e, capture_output=True, text=True, timeout=timeout,
                            stdin=subprocess.DEVNULL, preexec_fn=no_core)
    return cp, trace_files(tmp)


PYTEST_TESTS = (
    "import numpy as np, pytest, dlconsumer as C, dlproducer as P, dlstatic as S, np_leaky as L\n"
    "def test_static_leak():\n    S.ramp_total(P.good(4))\n"
    "def test_double_delete():\n    C.double_delete(P.good(4))\n"
    "@pytest.mark.capsan(allow=['numpy-leak'])\n"
    "def test_allowed():\n    L.keep_forever(np.ones(10))\n"
    "def test_clean():\n    pass\n"
)


def pytest_report() -> bytes | None:
    """`pytest --capsan --capsan-report=PATH`'s file, which `capsan report`
    reads too (savedreport.c): stacks cut to 8 frames, so that the seed
    stays well inside the fuzzer's 64 KiB."""
    import json
    work = Path(tempfile.mkdtemp(prefix="capsan-seeds-pytest-"))
    try:
        (work / "test_seed.py").write_text(PYTEST_TESTS)
        e = env()
        e["CAPSAN_OPTIONS"] = f"log_path={work / 't'}:protect=1"
        subprocess.run([PYTHON, "-m", "pytest", "-p", "no:cacheprovider", "-q", "--capsan",
                        f"--capsan-report={work / 'report.json'}", "test_seed.py"], env=e,
                       cwd=work, capture_output=True, timeout=120, stdin=subprocess.DEVNULL)
        doc = json.loads((work / "report.json").read_text())
    except (OSError, ValueError, subprocess.SubprocessError) as ex:
        print(f"seeds: no pytest report: {ex}", file=sys.stderr)
        return None
    finally:
        shutil.rmtree(work, ignore_errors=True)
    for t in doc.get("tests", []):
        for f in t.get("findings", []):
            for ev in f.get("events", []):
                ev["stack"] = ev["stack"][:8]
    return json.dumps(doc).encode()


def main() -> int:
    out = Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="capsan-seeds-"))
    made: dict[str, list[bytes]] = {}

    def one(name):
        cp, traces = run_one(name, work / name)
        return name, cp, [trimmed(t) for t in traces]

    try:
        with ThreadPoolExecutor(2) as pool:
            for name, cp, blobs in pool.map(one, RUNS):
                if not blobs:
                    print(f"seeds: {name}: no trace (exit {cp.returncode})\n{cp.stderr[-800:]}",
                          file=sys.stderr)
                    continue
                made[name] = blobs
                for i, b in enumerate(blobs):
                    (out / f"{name}.{i}").write_bytes(b)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    if not made:
        print("seeds: no traces made", file=sys.stderr)
        return 1

    # truncated copies, a whole process tree in one input, suppressions
    def put(name, blob):
        (out / name).write_bytes(blob)

    for name in ("double_delete", "np_leak", "leak_consumed", "bad_ndim"):
        if name not in made:
            continue
        b = made[name][0]
        put(f"{name}.cut-header", b[:40])
        put(f"{name}.cut-middle", b[:len(b) // 2 + 3])
        put(f"{name}.cut-tail", b[:len(b) - 5])
        off, last = struct.unpack_from("<I", b, 12)[0], 64
        while off + 8 <= len(b) and off < len(b) * 3 // 4:
            last = off
            off += struct.unpack_from("<HHI", b, off)[2] or len(b)
        put(f"{name}.cut-record", b[:last])
    # the reader's error paths: each record type too short for its payload
    hdr = made["double_delete"][0][:64] if "double_delete" in made else None
    if hdr:
        for typ in range(2, 11):
            put(f"short-record-{typ}", hdr + struct.pack("<HHI", typ, 0, 8))
        # an OPTIONS record after the events that changes protect: judged again
        opts = b"protect=0\0"
        opts += b"\0" * (-len(opts) % 8)
        put("double_delete.late-options",
            made["double_delete"][0] + struct.pack("<HHI", 9, 0, 8 + len(opts)) + opts)
        # more COUNTS records than the reader keeps points (downsampling)
        start = struct.unpack_from("<Q", hdr, 40)[0]
        counts = b"".join(struct.pack("<HHI6Q", 10, 0, 56, start + 1000 * k, 3 * k, k % 7,
                                      64 * (k % 7), k % 5, 800 * (k % 5)) for k in range(300))
        put("double_delete.many-counts", made["double_delete"][0] + counts)
    if len(made.get("fork", [])) > 1:
        put("fork.tree", b"".join(made["fork"]))
    if "leak_consumed" in made:
        put("leak_consumed.supp", made["leak_consumed"][0] + SUPP_MARK +
            b"# fuzz seed\ndlpack-leak:dl_leak.py$\nleak:^consume*\n*:libfoo.so\n")
    report = pytest_report()
    if report:
        put("pytest_report.json", report)
    total = sum(p.stat().st_size for p in out.iterdir())
    print(f"seeds: {len(list(out.iterdir()))} file(s), {total} bytes in {out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
