"""capsan report on synthetic traces: findings with their stacks, and no
crash on truncated or damaged files (reports/reader.c, reports/FORMAT.md).

The traces are written here with struct, following model/tracefmt.h, so
these tests need neither the runtime nor Python extensions: only
build/bin/capsan."""
import json
import os
import random
import re
import shutil
import signal
import struct
import subprocess
from pathlib import Path

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
# CAPSAN_BIN: run the same checks against another build (e.g. with ASan)
CAPSAN = os.environ.get("CAPSAN_BIN") or os.path.join(HERE, "..", "build", "bin", "capsan")
LIBCAPSAN = os.path.join(HERE, "..", "build", "lib", "libcapsan.so")

pytestmark = pytest.mark.skipif(not os.path.exists(CAPSAN), reason="build/bin/capsan not built")

# --- the format (model/tracefmt.h) ----------------------------------------

REC_PAD, REC_PROCESS, REC_MODULE, REC_CODE, REC_FRAME, REC_EVENT, REC_THREAD, REC_END, REC_OPTIONS, REC_COUNTS = range(1, 11)
REC_LIVE = 11
REC_CRASH = 12
EV_EXPORT, EV_CONSUME, EV_DELETE, EV_DESTROY = 1, 3, 5, 6
EV_NP_ALLOC, EV_NP_FREE, EV_NP_FOREIGN_FREE = 16, 17, 19
END_EXIT, END_SIGNAL = 1, 2
PY = 1 << 63
PY_ENTRY = 1 << 62
START_MONO = 1_000_000_000

PID = 4242
TENSOR = 0x55AA00001000
CAPSULE = 0x7F0000002000
DELETER = 0x7F0000003000


def pyframe(code, line, entry=False):
    return PY | (PY_ENTRY if entry else 0) | ((code & 0x3FFFFFFF) << 32) | line


def header(pid=PID, ppid=1, version=1, magic=b"CAPSANTR", header_size=64):
    return struct.pack("<8sIIQQQQ2Q", magic, version, header_size, pid, ppid, 0, START_MONO, 0, 0)


def rec(rtype, payload, flags=0):
    payload += b"\0" * (-len(payload) % 8)
    return struct.pack("<HHI", rtype, flags, 8 + len(payload)) + payload


def cstr(s):
    return (s if isinstance(s, bytes) else s.encode()) + b"\0"


def process(argv, exe):
    return rec(REC_PROCESS, struct.pack("<II", len(argv), 0) + b"".join(cstr(a) for a in argv) + cstr(exe))


def module(base, lo, hi, path, build_id=b""):
    p = path.encode()
    return rec(REC_MODULE, struct.pack("<QQQII", base, lo, hi, len(build_id), len(p)) + build_id + p + b"\0")


def code(code_id, file, name, firstlineno=1):
    f, n = file.encode(), name.encode()
    return rec(REC_CODE, struct.pack("<IIII", code_id, firstlineno, len(f), len(n)) + f + b"\0" + n + b"\0")


def frame(node, parent, value):
    return rec(REC_FRAME, struct.pack("<IIQ", node, parent, value))


def thread(n, tid, name):
    return rec(REC_THREAD, struct.pack("<IIQ", n, 0, tid) + cstr(name))


def event(kind, obj, a=0, b=0, c=0, stack=0, thread=1, t=0, flags=0, aux=0, extra=0):
    ev = struct.pack("<BBHIQQQQQII", kind, flags, aux, thread, START_MONO + t, obj, a, b, c, stack, extra)
    assert len(ev) == 56
    return rec(REC_EVENT, ev)


def end(how=END_EXIT, status=0, t=10_000, events=0):
    return rec(REC_END, struct.pack("<IiQQQQ", how, status, START_MONO + t, 0, 0, events))


def counts(t, events=0, live_dlpack=0, live_dlpack_bytes=0, live_numpy=0, live_numpy_bytes=0):
    return rec(REC_COUNTS, struct.pack("<QQQQQQ", START_MONO + t, events, live_dlpack,
                                       live_dlpack_bytes, live_numpy, live_numpy_bytes))


def downsample(records, cap=2000):
    """The reader's COUNTS downsampling (reports/tracecounts.c), as a model: buckets of
    `stride` records keep the latest time and the maximum of every series; when
    `cap` points are kept, neighbours merge and the stride doubles.
    records: tuples (time, events, dl, dl_bytes, np, np_bytes). Returns (points, stride)."""
    pts, stride, bucket, bn = [], 1, None, 0

    def merge(a, b):
        return tuple(max(x, y) for x, y in zip(a, b))

    def push(c):
        nonlocal pts, stride
        if len(pts) == cap:
            pts = [merge(pts[i], pts[i + 1]) for i in range(0, len(pts) - 1, 2)]
            stride *= 2
        pts.append(c)

    for r in records:
        bucket = r if bn == 0 else merge(bucket, r)
        bn += 1
        if bn >= stride:
            push(bucket)
            bn = 0
    if bn:
        push(bucket)
    return sorted(pts), stride


def double_delete_trace():
    """EXPORT, CONSUME, DELETE, DELETE of one DLManagedTensor, with Python
    stacks: x.py:20 <module> -> x.py:12 bad_consumer."""
    return b"".join([
        header(),
        process(["python3", "x.py"], "/usr/bin/python3"),
        rec(REC_OPTIONS, cstr("log_path=capsan.trace")),
        thread(1, PID, "MainThread"),
        code(1, "/work/x.py", "<module>"),
        code(2, "/work/x.py", "bad_consumer", 10),
        frame(1, 0, pyframe(1, 20, entry=True)),   # outermost
        frame(2, 1, pyframe(2, 12)),               # innermost: the leaf
        frame(3, 1, pyframe(1, 18, entry=True)),
        event(EV_EXPORT, TENSOR, a=CAPSULE, b=DELETER, c=800, stack=3, t=1),
        event(EV_CONSUME, TENSOR, a=CAPSULE, stack=2, t=2),
        event(EV_DELETE, TENSOR, stack=2, t=3),
        event(EV_DELETE, TENSOR, stack=2, t=4),
        end(),
    ])


def write(tmp_path, data, name="capsan.trace.4242"):
    p = tmp_path / name
    p.write_bytes(data)
    return str(p)


def report(*args, check_signal=True):
    r = subprocess.run([CAPSAN, "report", *args], capture_output=True, text=True,
                       errors="replace", timeout=60)
    if check_signal:
        assert r.returncode >= 0, f"capsan report died of signal {-r.returncode}: {r.stderr}"
    return r


def only_process(doc):
    assert doc["tool"] == "capsan" and doc["format"] == 1
    assert len(doc["processes"]) == 1
    return doc["processes"][0]


# --- findings ---------------------------------------------------------------

def test_double_delete_json(tmp_path):
    path = write(tmp_path, double_delete_trace())
    r = report("--format", "json", path)
    assert r.returncode == 0, r.stderr
    proc = only_process(json.loads(r.stdout))
    assert proc["pid"] == PID and proc["ppid"] == 1
    assert proc["argv"] == ["python3", "x.py"]
    assert proc["ended"] == "exit" and proc["status"] == 0
    kinds = [f["kind"] for f in proc["findings"]]
    assert kinds == ["dlpack-double-delete"], kinds
    f = proc["findings"][0]
    assert f["severity"] == "error"
    assert f["object"]["address"] == hex(TENSOR)
    assert f["object"]["type"].startswith("DLManagedTensor")
    assert [e["event"] for e in f["events"]] == ["export", "consume", "delete", "delete"]
    last = f["events"][-1]
    assert last["thread"] == 1 and last["time_ns"] == 4
    top = last["stack"][0]
    assert top == {"python": True, "file": "/work/x.py", "line": 12, "function": "bad_consumer"}
    assert last["stack"][1]["function"] == "<module>" and last["stack"][1]["line"] == 20
    assert f["events"][0]["stack"][0]["line"] == 18
    s = proc["summary"]
    assert s["errors"] == 1 and s["warnings"] == 0 and s["events"] == 4


def test_double_delete_text(tmp_path):
    path = write(tmp_path, double_delete_trace())
    r = report(path)
    assert r.returncode == 0, r.stderr
    out = r.stdout
    assert "== process 4242 (python3 x.py) ended: exit 0 ==" in out
    assert "=" * 65 + "\n==4242==ERROR: capsan: dlpack-double-delete: " in out
    assert re.search(r"\(thread T1\):\n    #0 /work/x.py:12 in bad_consumer\n    #1 /work/x.py:20 in <module>\n", out), out
    assert "SUMMARY: capsan: 1 error(s), 0 warning(s) [dlpack-double-delete: 1]; 0 byte(s) leaked in 0 object(s)." in out
    assert "\033[" not in out  # no colour when not on a terminal


def test_leak_only_judged_on_exit(tmp_path):
    body = [header(), process(["python3"], "/usr/bin/python3"),
            event(EV_NP_ALLOC, 0x1000, a=4096, t=1),
            event(EV_NP_ALLOC, 0x2000, a=100, t=2),
            event(EV_NP_FREE, 0x2000, a=100, t=3)]
    exited = write(tmp_path, b"".join(body + [end()]), "exited")
    killed = write(tmp_path, b"".join(body) + b"\0" * 4096, "killed")
    r = report("--format", "json", exited)
    proc = only_process(json.loads(r.stdout))
    assert [f["kind"] for f in proc["findings"]] == ["numpy-leak"]
    assert proc["summary"]["leaked_bytes"] == 4096
    assert "4096 byte(s) leaked in 1 object(s)" in report(exited).stdout
    r = report("--format", "json", killed)
    assert r.returncode == 0, r.stderr
    proc = only_process(json.loads(r.stdout))
    assert proc["ended"] == "unknown" and proc["findings"] == []
    assert "ended: unknown" in report(killed).stdout


def native_symbol(lib, name):
    """(ELF type, address of a dynamic symbol) via nm, or None."""
    if not shutil.which("nm") or not os.path.exists(lib):
        return None
    with open(lib, "rb") as f:
        etype = struct.unpack("<H", f.read(18)[16:18])[0]
    out = subprocess.run(["nm", "-D", "--defined-only", lib], capture_output=True, text=True).stdout
    for line in out.splitlines():
        parts = line.split()
        if len(parts) == 3 and parts[2].split("@")[0] == name and parts[1] in "TtWi":
            return etype, int(parts[0], 16)
    return None


def test_native_frames_symbolized_and_merged(tmp_path):
    """Native frames get names from libdw; each _PyEval_EvalFrameDefault is
    replaced by the Python frames it ran, split at entry frames."""
    libc = "/lib/x86_64-linux-gnu/libc.so.6"
    py = os.path.realpath("/usr/bin/python3")
    s_free = native_symbol(libc, "free")
    s_eval = native_symbol(py, "_PyEval_EvalFrameDefault")
    if not s_free or not s_eval or s_free[0] != 3:
        pytest.skip("needs a shared libc and an interpreter exporting _PyEval_EvalFrameDefault")
    libc_base = 0x7F1200000000
    py_base = 0 if s_eval[0] == 2 else 0x560000000000
    ip_free = libc_base + s_free[1] + 8
    ip_eval = py_base + s_eval[1] + 8
    ip_nowhere = 0x1234
    data = b"".join([
        header(), process(["python3", "y.py"], py),
        module(libc_base, libc_base, libc_base + 0x1000000, libc),
        module(py_base, py_base + 0x400000, py_base + 0x2000000, py),
        code(1, "/work/y.py", "<module>"), code(2, "/work/y.py", "inner"), code(3, "/work/y.py", "outer"),
        # outermost first: module (entry) <- outer (entry) <- inner (not entry)
        frame(1, 0, pyframe(1, 30, entry=True)),
        frame(2, 1, pyframe(3, 20, entry=True)),
        frame(3, 2, pyframe(2, 10)),
        frame(4, 3, ip_eval),
        frame(5, 4, ip_nowhere),
        frame(6, 5, ip_eval),
        frame(7, 6, ip_free),          # leaf: innermost native frame
        event(EV_NP_FOREIGN_FREE, 0x9000, a=16, stack=7, t=1),   # a foreign free
        end(),
    ])
    r = report("--format", "json", write(tmp_path, data))
    assert r.returncode == 0, r.stderr
    proc = only_process(json.loads(r.stdout))
    assert [f["kind"] for f in proc["findings"]] == ["numpy-foreign-free"]
    st = proc["findings"][0]["events"][-1]["stack"]
    desc = [(fr["python"], fr["function"]) for fr in st]
    assert desc[0][0] is False and "free" in desc[0][1], desc
    assert st[0]["module"] == "libc.so.6" and st[0]["address"] == hex(ip_free)
    assert desc[1:3] == [(True, "inner"), (True, "outer")], desc
    assert st[3]["python"] is False and st[3]["function"] == "" and st[3]["address"] == hex(ip_nowhere)
    assert desc[4] == (True, "<module>"), desc
    assert len(st) == 5
    text = report(write(tmp_path, data, "t2")).stdout
    # file:line when libc's debug info is installed, else module+offset
    assert re.search(r"#0 0x[0-9a-f]+ in \S*free\S* (\(libc\.so\.6\+0x[0-9a-f]+\)|\S+:\d+)\n", text), text
    assert "#1 /work/y.py:10 in inner" in text
    assert "#3 0x1234 (<unknown module>)" in text


# --- suppressions and usage -------------------------------------------------

def test_suppressions(tmp_path):
    path = write(tmp_path, double_delete_trace())
    supp = tmp_path / "supp.txt"
    supp.write_text("# comment\nleak:bad_consumer\n")
    r = report("--format", "json", "--suppressions", str(supp), path)
    assert [f["kind"] for f in only_process(json.loads(r.stdout))["findings"]] == ["dlpack-double-delete"]
    supp.write_text("dlpack-double-delete:^bad_*er$\n")
    r = report("--format", "json", "--suppressions", str(supp), path)
    proc = only_process(json.loads(r.stdout))
    assert proc["findings"] == [] and proc["summary"]["suppressed"] == 1
    r = report("--suppressions", str(supp), path)
    assert "Suppressions used:" in r.stdout and "0 error(s)" in r.stdout
    supp.write_text("no-such-kind:x\n")
    r = report("--suppressions", str(supp), path)
    assert r.returncode == 2 and "unknown finding kind" in r.stderr


def test_usage_errors(tmp_path):
    path = write(tmp_path, double_delete_trace())
    for args in (["--bogus", path], ["--format", "yaml", path], [], ["--format"]):
        r = report(*args)
        assert r.returncode == 2, (args, r.returncode)
        assert "capsan:" in r.stderr and r.stdout == ""
    r = subprocess.run([CAPSAN, "frobnicate"], capture_output=True, text=True)
    assert r.returncode == 2 and "unknown command" in r.stderr
    r = subprocess.run([CAPSAN, "help-options"], capture_output=True, text=True)
    assert r.returncode == 0 and re.search(r"log_path\s+string\s+default capsan.trace", r.stdout)
    assert re.search(r"exitcode\s+int\s+default 23", r.stdout)
    # the package's version, as `python -c 'import capsan; print(capsan.__version__)'`
    init = (Path(__file__).resolve().parents[1] / "pyhook" / "capsan" / "__init__.py").read_text()
    version = re.search(r'^__version__ = "([^"]+)"', init, re.M).group(1)
    r = subprocess.run([CAPSAN, "--version"], capture_output=True, text=True)
    assert (r.returncode, r.stdout) == (0, f"capsan {version}\n"), (r.returncode, r.stdout, r.stderr)


def test_end_record_with_an_unknown_ending(tmp_path):
    """A newer writer's ending (or a damaged field) is not 'no END record'."""
    data = double_delete_trace().replace(end(), end(how=9, status=4))
    path = write(tmp_path, data)
    r = report(path)
    assert r.returncode == 0 and "END record with ending 9, status 4" in r.stdout, r.stdout
    assert "no END record" not in r.stdout
    r = report("--format=html", "-o", str(tmp_path / "r.html"), path)
    assert r.returncode == 0, r.stderr
    assert "END record with ending 9, status 4" in (tmp_path / "r.html").read_text()
    r = report("--format=json", path)
    assert only_process(json.loads(r.stdout))["ended"] == "unknown"


def test_the_same_trace_twice_is_reported_once(tmp_path):
    """A glob plus an explicit path, or a symlink: one process, one report."""
    path = write(tmp_path, double_delete_trace())
    link = tmp_path / "link"
    link.symlink_to(path)
    r = report("--format=json", path, str(link), path, str(tmp_path / "missing"))
    assert r.returncode == 1, r.stderr  # the missing one
    assert r.stderr.count("reported once") == 2, r.stderr
    assert "missing: cannot open" in r.stderr, r.stderr
    doc = json.loads(r.stdout)
    assert [p["pid"] for p in doc["processes"]] == [PID], doc["processes"]


def test_output_file_and_many_traces(tmp_path):
    a = write(tmp_path, double_delete_trace(), "a")
    b = write(tmp_path, double_delete_trace().replace(struct.pack("<Q", PID), struct.pack("<Q", 77), 1), "b")
    out = tmp_path / "out.json"
    r = report("--format=json", "-o", str(out), a, b)
    assert r.returncode == 0 and r.stdout == ""
    doc = json.loads(out.read_text())
    assert [p["pid"] for p in doc["processes"]] == [PID, 77]


# --- damaged traces ---------------------------------------------------------

def test_bad_headers(tmp_path):
    good = double_delete_trace()
    cases = {
        "empty": b"",
        "short": good[:40],
        "magic": b"NOTATRAC" + good[8:],
        "version": header(version=9) + good[64:],
        "hdrsize": header(header_size=12) + good[64:],
    }
    for name, data in cases.items():
        r = report("--format", "json", write(tmp_path, data, name))
        assert r.returncode == 1, name
        assert "offset" in r.stderr, (name, r.stderr)
        assert json.loads(r.stdout)["processes"] == []
    r = report(str(tmp_path / "does-not-exist"))
    assert r.returncode == 1 and "cannot open" in r.stderr


def test_corrupt_record_keeps_what_came_before(tmp_path):
    good = double_delete_trace()
    off = good.index(struct.pack("<HHI", REC_EVENT, 0, 64), 64)
    bad = good[:off] + struct.pack("<HHI", REC_EVENT, 0, 61) + good[off + 8:]
    r = report("--format", "json", write(tmp_path, bad))
    assert r.returncode == 1
    assert f"corrupt record at offset {off:#x}" in r.stderr, r.stderr
    proc = only_process(json.loads(r.stdout))
    assert proc["argv"] == ["python3", "x.py"] and proc["error"]


def crash(ips, py, tid=4242):
    body = struct.pack("<IIQ", len(ips), len(py), tid) + b"".join(struct.pack("<Q", ip) for ip in ips)
    for file, name, line in py:
        body += struct.pack("<I", line) + cstr(file) + cstr(name)
    return rec(REC_CRASH, body)


def test_crash_record_read_and_checked(tmp_path):
    """CRASH (12): the crashing thread's stacks after a signal END, in the
    text and JSON reports; one that claims more than it holds is corrupt,
    and what came before is still reported."""
    base = header() + process(["python3", "x.py"], "/usr/bin/python3")
    sig_end = rec(REC_END, struct.pack("<IiQQQQ", 2, 6, START_MONO + 100, 0, 0x7F00000010, 0))
    good = base + sig_end + crash([0x7F00000010, 0x7F00000020], [("/w/x.py", "<module>", 9)])
    r = report("--format", "json", write(tmp_path, good))
    assert r.returncode == 0, r.stderr
    proc = only_process(json.loads(r.stdout))
    st = proc["crash"]["stack"]
    assert proc["crash"]["thread"] == 4242 and len(st) == 3, st
    assert [f["python"] for f in st] == [False, False, True] and st[2]["line"] == 9, st
    text = report(write(tmp_path, good, "capsan.trace.4243")).stdout
    assert "   the crashing thread (4242):\n" in text and "#2 /w/x.py:9 in <module>" in text, text
    bad = base + sig_end + crash([1, 2], [("/w/x.py", "f", 1)])[:-8]
    bad = bad[:len(base + sig_end)] + struct.pack("<HHI", REC_CRASH, 0, 32) + \
        struct.pack("<IIQ", 9, 0, 1) + b"\0" * 8
    r = report("--format", "json", write(tmp_path, bad, "capsan.trace.4244"))
    assert r.returncode == 1 and "CRASH record shorter than its stack" in r.stderr, r.stderr
    assert only_process(json.loads(r.stdout))["ended"] == "signal"


def test_uncommitted_record_is_skipped(tmp_path):
    """The writer stores the type last: a sized record with type 0 was never
    committed; records after it still count."""
    good = double_delete_trace()
    off = good.index(struct.pack("<HHI", REC_EVENT, 0, 64), 64)
    cut = good[:off] + struct.pack("<HHI", 0, 0, 64) + b"\0" * 56 + good[off:]
    r = report("--format", "json", write(tmp_path, cut))
    assert r.returncode == 0, r.stderr
    assert [f["kind"] for f in only_process(json.loads(r.stdout))["findings"]] == ["dlpack-double-delete"]


def check_no_crash(path):
    for fmt in ("json", "text"):
        r = report("--format", fmt, path)
        assert r.returncode in (0, 1), (path, fmt, r.returncode, r.stderr[-2000:])
        if r.returncode == 1:
            assert "offset" in r.stderr, r.stderr
        if fmt == "json":
            json.loads(r.stdout)  # always a complete document


def test_truncated_at_every_record_boundary(tmp_path):
    good = double_delete_trace()
    for n in range(0, len(good) + 1, 8):
        check_no_crash(write(tmp_path, good[:n], f"trunc{n}"))
        # the writer's way: the rest of the grown file stays zeroed
        check_no_crash(write(tmp_path, good[:n] + b"\0" * 256, f"ztrunc{n}"))


def test_random_byte_flips(tmp_path):
    rng = random.Random(20240601)
    good = bytearray(double_delete_trace())
    for i in range(200):
        data = bytearray(good)
        for _ in range(rng.choice((1, 1, 2, 4, 16))):
            pos = rng.randrange(len(data))
            data[pos] = rng.randrange(256) if rng.random() < 0.7 else data[pos] ^ (1 << rng.randrange(8))
        path = write(tmp_path, bytes(data), f"flip{i}")
        r = report("--format", "json", path)
        assert r.returncode in (0, 1), (i, r.returncode, r.stderr[-2000:])
        if r.returncode == 1:
            assert "offset" in r.stderr
        json.loads(r.stdout)


def test_hostile_values(tmp_path):
    """Huge ids, parent cycles, unknown record types, odd strings: no crash,
    valid JSON with control and non-UTF-8 bytes escaped."""
    data = b"".join([
        header(), process(["py\x01thon", b"x\xff.py"], "/nonexistent/exe"),
        module(0, 0, 0xFFFFFFFFFFFFFFFF, "/nonexistent/lib.so", b"\xde\xad\xbe\xef"),
        code(0x3FFFFFFF, "f\"il\\e\n.py", "na\x7fme"),
        frame(0xFFFFFFFF, 0xFFFFFFFE, pyframe(0x3FFFFFFF, 0xFFFFFFFF, True)),
        frame(0xFFFFFFFE, 0xFFFFFFFF, 0x7000),        # a cycle
        rec(77, b"from a newer writer"),
        rec(REC_PAD, b"\0" * 16),
        event(EV_EXPORT, TENSOR, a=CAPSULE, stack=0xFFFFFFFF, thread=0xFFFFFFFF),
        event(EV_DELETE, TENSOR, stack=0xFFFFFFFF),
        event(EV_DELETE, TENSOR, stack=0xFFFFFFFF),
        event(0xEE, 0, stack=12345),
        end(how=END_SIGNAL, status=11),
    ])
    path = write(tmp_path, data)
    r = report("--format", "json", path)
    assert r.returncode == 0, r.stderr
    proc = only_process(json.loads(r.stdout))
    assert proc["ended"] == "signal" and proc["status"] == 11
    assert proc["argv"][0] == "py\x01thon"
    assert proc["argv"][1] == "x\ufffd.py"
    assert proc["findings"], proc
    frames = proc["findings"][0]["events"][0]["stack"]
    assert 0 < len(frames) <= 256
    assert frames[-1]["file"] == "f\"il\\e\n.py"
    r = report(path)
    assert r.returncode == 0 and "ended: signal 11 (SIGSEGV)" in r.stdout


# --- capsan run -------------------------------------------------------------

needs_runtime = pytest.mark.skipif(not os.path.exists(LIBCAPSAN), reason="libcapsan.so not built")


@needs_runtime
def test_run_environment_and_status(tmp_path):
    env = dict(os.environ, CAPSAN_OPTIONS="log_path=/tmp/user:protect=0:verbosity=0",
               LD_PRELOAD="")
    r = subprocess.run([CAPSAN, "run", "--protect", "--log-path", str(tmp_path / "t"), "--",
                        "sh", "-c", 'echo "$LD_PRELOAD"; echo "$CAPSAN_OPTIONS"; exit 3'],
                       capture_output=True, text=True, env=env, cwd=tmp_path)
    assert r.returncode == 3, r.stderr
    preload, opts = r.stdout.splitlines()
    assert preload == os.path.realpath(LIBCAPSAN)
    # keep_trace=always: the run sums up every trace, then removes the clean ones
    assert opts == f"verbosity=0:protect=1:log_path={tmp_path / 't'}:keep_trace=always"


@needs_runtime
def test_run_signal_and_errors(tmp_path):
    r = subprocess.run([CAPSAN, "run", "--log-path", "tr", "--", "sh", "-c", "kill -9 $$"],
                       capture_output=True, text=True, cwd=tmp_path)
    assert r.returncode == 128 + signal.SIGKILL
    # sh recorded nothing, so there is no trace to name (test_bad_input.py
    # has a killed process that left one)
    assert re.search(r"capsan: sh killed by signal 9; it left no trace \(tr\.\d+: No such file",
                     r.stderr), r.stderr
    r = subprocess.run([CAPSAN, "run", "--", "/nonexistent/cmd"], capture_output=True, text=True)
    assert r.returncode == 127 and "cannot run" in r.stderr
    for args in (["--options", "nosuch=1", "--", "true"], ["--exitcode", "x", "--", "true"],
                 ["--frob", "--", "true"], []):
        r = subprocess.run([CAPSAN, "run", *args], capture_output=True, text=True)
        assert r.returncode == 2, args


# --- a real trace, cut and damaged ---------------------------------------------------
#
# The same checks on a trace the runtime wrote: every record boundary, random
# offsets inside records, and random byte flips. Each family is one `capsan
# report` over all its files (fast: the ELF files are read once), then the
# JSON entries are matched back to the files by their "trace" field.

REAL_SCRIPT = """\
import dlconsumer as C
import dlproducer as P
cap = P.good(8)
C.double_delete(cap)
C.consume_leak(P.good(4))
print("done", flush=True)
"""


def records(data):
    """(offset, type, size) of every record up to the end-of-data marker."""
    out, off = [], struct.unpack_from("<I", data, 12)[0]
    while off + 8 <= len(data):
        rtype, _, size = struct.unpack_from("<HHI", data, off)
        if rtype == 0 and size == 0:
            break
        out.append((off, rtype, size))
        off += size
    return out


@pytest.fixture(scope="module")
def real_trace(tmp_path_factory):
    from conftest import CAPSAN as CAPSAN_RUN, STATIC_PY, base_env, no_core, require_runtime
    require_runtime()
    tmp = tmp_path_factory.mktemp("real")
    (tmp / "prog.py").write_text(REAL_SCRIPT)
    # the build's capsan runs the program; CAPSAN (maybe CAPSAN_BIN) reports
    cp = subprocess.run([str(CAPSAN_RUN), "run", "--log-path", str(tmp / "t"), "--", str(STATIC_PY), "prog.py"],
                        capture_output=True, text=True, cwd=tmp, timeout=120, preexec_fn=no_core,
                        env=base_env({"CAPSAN_OPTIONS": "protect=1"}))
    assert "done" in cp.stdout, cp.stderr
    paths = [p for p in tmp.iterdir() if re.fullmatch(r"t\.\d+", p.name)]
    assert len(paths) == 1, paths
    data = paths[0].read_bytes()
    recs = records(data)
    data = data[:recs[-1][0] + recs[-1][2]]   # without the zeroed tail
    assert recs[-1][1] == REC_END
    return data, recs


def report_many(paths, fmt="json"):
    """One `capsan report` over many files: never a signal, exit 0/1, valid JSON;
    returns (the process entries by trace path, stderr)."""
    r = subprocess.run([CAPSAN, "report", "--format", fmt, *map(str, paths)], capture_output=True,
                       text=True, errors="replace", timeout=120)
    if r.returncode < 0 or r.returncode not in (0, 1):
        # find the file that did it, for the message
        for p in paths:
            one = report("--format", fmt, str(p), check_signal=False)
            assert one.returncode in (0, 1), (p, one.returncode, one.stderr[-2000:])
        pytest.fail(f"capsan report died ({r.returncode}) on the batch: {r.stderr[-2000:]}")
    if fmt != "json":
        return None, r.stderr
    doc = json.loads(r.stdout)
    return {p["trace"]: p for p in doc["processes"]}, r.stderr


def kinds_of(proc):
    return sorted(f["kind"] for f in proc["findings"])


def test_real_trace_cut_at_every_record_boundary(tmp_path, real_trace):
    data, recs = real_trace
    whole, _ = report_many([write(tmp_path, data, "whole")])
    (full,) = whole.values()
    assert kinds_of(full) == ["dlpack-double-delete", "dlpack-leak"], full
    proc_end = next(o + s for o, t, s in recs if t == REC_PROCESS)
    # the double delete is judged when its second DELETE event is read
    events = [(o, s) for o, t, s in recs if t == REC_EVENT]
    dd_kinds = [struct.unpack_from("<B", data, o + 8)[0] for o, _ in events]
    second_delete = [o + s for (o, s), k in zip(events, dd_kinds) if k == EV_DELETE][1]
    # the LIVE record whose slot holds the leaked tensor (each record is
    # committed empty and its slots are filled in place later)
    def live_tensor(o, s):
        nslots = struct.unpack_from("<I", data, o + 8)[0]
        return any(struct.unpack_from("<Q", data, o + 16 + 40 * i)[0] and
                   data[o + 16 + 40 * i + 36] == EV_EXPORT for i in range(nslots))
    live_end = min(o + s for o, t, s in recs if t == REC_LIVE and live_tensor(o, s))
    cuts = [64] + [o + s for o, _, s in recs]
    paths = [write(tmp_path, data[:n], f"cut{n}") for n in cuts]
    procs, err = report_many(paths)
    for n, p in zip(cuts, paths):
        proc = procs[p]
        assert proc["error"] is None, (n, proc["error"])          # a boundary is a clean end
        assert proc["pid"] == full["pid"]
        if n >= proc_end:
            assert proc["argv"] == full["argv"], n
        want = ["dlpack-double-delete"] if n >= second_delete else []
        if n >= live_end:
            # no END record: the live state says what the process held, and
            # the leaked tensor is a warning (not released when killed)
            want = sorted(want + ["dlpack-leak"])
            leak = [f for f in proc["findings"] if f["kind"] == "dlpack-leak"]
            assert leak and leak[0]["severity"] == ("error" if n == len(data) else "warning"), n
        if n == len(data):
            want = kinds_of(full)                                 # END: now leaks count
        assert kinds_of(proc) == want, (n, kinds_of(proc))
        assert proc["ended"] == ("exit" if n == len(data) else "unknown"), n
    # text over the same files: no crash either
    report_many(paths, fmt="text")


def test_real_trace_cut_inside_records(tmp_path, real_trace):
    """A cut inside a record is corrupt at that record's offset; what came before stays."""
    data, recs = real_trace
    rng = random.Random(1234)
    starts = [o for o, _, _ in recs]
    cuts = sorted({rng.randrange(65, len(data)) for _ in range(80)} - set(starts) -
                  {o + s for o, _, s in recs})
    paths = [write(tmp_path, data[:n], f"mid{n}") for n in cuts]
    procs, err = report_many(paths)
    # what the file says up to the damaged record: the same file cut there
    ats = sorted({max(o for o in starts if o < n) for n in cuts})
    refs, _ = report_many([write(tmp_path, data[:a], f"ref{a}") for a in ats])
    for n, p in zip(cuts, paths):
        at = max(o for o in starts if o < n)          # the record the cut falls into
        proc = procs[p]
        assert proc["error"] and f"at offset {at:#x}" in proc["error"], (n, at, proc["error"])
        assert f"{p}: corrupt record at offset {at:#x}" in err
        ref = refs[str(tmp_path / f"ref{at}")]
        assert kinds_of(proc) == kinds_of(ref) and proc["argv"] == ref["argv"], n
        assert proc["summary"]["events"] == ref["summary"]["events"], n


def test_real_trace_random_byte_flips(tmp_path, real_trace):
    data, recs = real_trace
    rng = random.Random(20240917)
    paths = []
    for i in range(150):
        d = bytearray(data)
        for _ in range(rng.choice((1, 1, 2, 3, 8))):
            pos = rng.randrange(len(d))
            d[pos] = rng.randrange(256) if rng.random() < 0.6 else d[pos] ^ (1 << rng.randrange(8))
        paths.append(write(tmp_path, bytes(d), f"flip{i}"))
    procs, err = report_many(paths)
    for p in paths:
        if p in procs:
            if procs[p]["error"]:
                assert re.search(r"at offset 0x[0-9a-f]+", procs[p]["error"])
        else:                                         # rejected as a whole: the header
            assert re.search(re.escape(p) + r": .*offset 0x[0-9a-f]+", err), (p, err[-2000:])
    report_many(paths, fmt="text")
    report_many(paths[:40], fmt="html")
