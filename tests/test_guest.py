"""capsan is a guest in someone else's process: bad options are named and
leave the defaults in force, the program's descriptors and files stay its
own, and a report never hangs or sends the traced program's bytes to the
terminal raw. Each case was once a way to break it."""
import os
import subprocess

from conftest import (CAPSAN, base_env, capsan_report, findings, kinds, marker_line, process_of,
                      run_capsan, trace_files)

LEAK = ("import dlconsumer as C, dlproducer as P\n"
        "C.consume_leak(P.good(4))  # <-- leak\n"
        "print('ran', flush=True)\n")


def test_bad_option_values_are_named_and_defaults_kept(tmp_path):
    bad = ["exitcode=300", "native_depth=-1", "report=xml", "max_findings=abc",
           "python_depth=99999999999999999999", "log_path="]
    res = run_capsan(LEAK, tmp_path, mode="preload", options=bad)
    for opt in bad:
        key, _, value = opt.partition("=")
        line = next((ln for ln in res.stderr.splitlines() if f"'{key}'" in ln), "")
        assert line.startswith("capsan:") and value in line, (opt, res.stderr)
    # the defaults stayed: exit status 23, the text report, stacks on
    assert res.returncode == 23 and "ran" in res.stdout, res.describe()
    assert "ERROR: capsan: dlpack-leak" in res.stderr, res.describe()
    (f,) = findings(res.report, "dlpack-leak")
    assert any(not fr.get("python") for e in f["events"] for fr in e["stack"]), f


def test_capsan_run_refuses_bad_values_before_starting(tmp_path):
    marker = tmp_path / "started"
    cmd = ["/bin/sh", "-c", f"touch {marker}"]
    for flags, word in ((["--options", "report=xml"], "text|json|none"),
                        (["--exitcode", "300"], "0..255"),
                        (["--options", "native_depth=-3"], "0..128"),
                        (["--log-path", "--"], "needs a value")):
        r = subprocess.run([str(CAPSAN), "run", *flags, "--", *cmd], capture_output=True, text=True,
                           env=base_env(), timeout=60)
        assert r.returncode == 2 and word in r.stderr, (flags, r.returncode, r.stderr)
        assert not marker.exists(), flags
    # what the runtime accepts, capsan run accepts too
    r = subprocess.run([str(CAPSAN), "run", "--options", "protect=yes,halt_on_error=no", "--", *cmd],
                       capture_output=True, text=True, env=base_env(), timeout=60)
    assert r.returncode == 0 and marker.exists(), r.stderr


def test_closed_stdout_and_stderr_stay_closed(tmp_path):
    """With fds 1 and 2 closed, the trace must not take them: the program's
    own writes still fail, and the trace is not overwritten."""
    code = ("import os, dlconsumer as C, dlproducer as P\n"
            "r, w = os.pipe()\n"
            "os.close(1); os.close(2)\n"
            "C.double_delete(P.good(4))  # <-- twice\n"
            "res = []\n"
            "for fd in (1, 2):\n"
            "    try:\n"
            "        os.write(fd, b'x')\n"
            "        res.append('wrote')\n"
            "    except OSError as e:\n"
            "        res.append(e.errno)\n"
            "os.write(w, repr(res).encode())\n"
            "os.close(w)\n"
            "import sys; sys.stdout = sys.stderr = open(os.devnull, 'w')\n"
            f"open({str(tmp_path / 'fds.out')!r}, 'w').write(os.read(r, 100).decode())\n")
    res = run_capsan(code, tmp_path, mode="preload", options=["protect=1"])
    out = (tmp_path / "fds.out").read_text() if (tmp_path / "fds.out").exists() else ""
    assert out == "[9, 9]", (out, res.describe())  # EBADF both times
    assert res.report is not None, res.describe()
    assert kinds(res.report) == {"dlpack-double-delete"}, res.describe()


def test_dup2_over_the_trace_descriptor(tmp_path):
    """A program that dup2s its own file over every descriptor above 2
    keeps its file intact, and the trace (past its first 8 MiB chunk)
    still replays."""
    mine = tmp_path / "mine.txt"
    code = ("import os, dlconsumer as C, dlproducer as P\n"
            "C.double_delete(P.good(4))  # <-- twice\n"
            f"f = os.open({str(mine)!r}, os.O_RDWR | os.O_CREAT | os.O_TRUNC)\n"
            "os.write(f, b'mine')\n"
            "for k in range(3, 64):\n"
            "    if k != f:\n"
            "        try:\n"
            "            os.dup2(f, k)\n"
            "        except OSError:\n"
            "            pass\n"
            "for _ in range(60000):\n"
            "    C.consume_good(P.good(4))\n"
            "print('done', flush=True)\n")
    res = run_capsan(code, tmp_path, mode="preload",
                     options=["protect=1", "record_all=1", "native_depth=0", "python_depth=0"])
    assert res.returncode == 23 and "done" in res.stdout, res.describe()
    assert mine.read_bytes() == b"mine", mine.read_bytes()[:200]
    (trace,) = trace_files(tmp_path)
    assert trace.stat().st_size > 8 << 20, trace.stat().st_size
    assert kinds(res.report) == {"dlpack-double-delete"}, res.describe()
    assert process_of(res.report)["summary"]["events"] >= 3 * 60000, res.describe()


def test_trace_tail_blocks_are_given_back(tmp_path):
    res = run_capsan(LEAK, tmp_path, mode="preload")
    assert res.returncode == 23, res.describe()
    (trace,) = trace_files(tmp_path)
    st = trace.stat()
    assert st.st_size == 8 << 20 and st.st_blocks * 512 < 1 << 20, (st.st_size, st.st_blocks)
    assert kinds(res.report) == {"dlpack-leak"}


def test_json_report_without_a_trace_falls_back_to_text(tmp_path):
    script = tmp_path / "prog.py"
    script.write_text(LEAK)
    res = run_capsan(script, tmp_path, mode="preload",
                     options=[f"log_path={tmp_path}/no/such/dir/t", "report=json"])
    assert res.returncode == 23 and "ran" in res.stdout, res.describe()
    assert "cannot create trace file" in res.stderr, res.stderr
    assert "report=json needs the trace file" in res.stderr, res.stderr
    assert "ERROR: capsan: dlpack-leak" in res.stderr and "SUMMARY: capsan:" in res.stderr
    line = marker_line(script, "leak")
    assert f"prog.py:{line}" in res.stderr, res.stderr


def test_report_does_not_wait_on_a_fifo(tmp_path):
    fifo = tmp_path / "trace.fifo"
    os.mkfifo(fifo)
    r = subprocess.run([str(CAPSAN), "report", str(fifo)], capture_output=True, text=True,
                       timeout=30)
    assert r.returncode == 1 and "not a regular file" in r.stderr, (r.returncode, r.stderr)


def test_control_bytes_in_names_are_escaped(tmp_path):
    """A Python file name with an escape sequence reaches the terminal as
    text (\\x1b), never as the byte."""
    script = tmp_path / "evil\x1b[2Jname.py"
    script.write_text(LEAK)
    res = run_capsan(script, tmp_path, mode="preload")
    assert res.returncode == 23, res.describe()
    for text in (res.stderr, capsan_report(trace_files(tmp_path), "text")[0].stdout):
        assert "evil\\x1b[2Jname.py" in text, text[-2000:]
        assert "\x1b" not in text
