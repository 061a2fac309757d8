"""A stop for a debugger (issue 34), as ASan users have one: every error
finding calls the exported no-op __capsan_report_error before it is
reported (`break __capsan_report_error`), and abort_on_error=1 raises
SIGABRT right after the report, so that gdb or a core dump stops at the
finding with capsan's report already printed. Driven with gdb in batch
mode, as a user at a terminal would."""
import re
import shutil
import signal
import subprocess

import pytest

from conftest import LIBCAPSAN, STATIC_PY, base_env, require_runtime

PROG = """\
import dlconsumer as C, dlproducer as P
C.double_delete(P.good(4))
print("after the finding", flush=True)
"""


def gdb_batch(tmp_path, commands, options):
    require_runtime()
    gdb = shutil.which("gdb")
    if gdb is None:
        pytest.fail("gdb is not installed (.ci/deps installs it)", pytrace=False)
    prog = tmp_path / "prog.py"
    prog.write_text(PROG)
    env = base_env(interpreter=STATIC_PY)
    args = [gdb, "-nx", "-batch", "-ex", "set breakpoint pending on",
            "-ex", "set startup-with-shell off"]
    for c in commands:
        args += ["-ex", c]
    args += ["--args", "/usr/bin/env", f"LD_PRELOAD={LIBCAPSAN}",
             f"CAPSAN_OPTIONS=log_path={tmp_path / 't'}:{options}", str(STATIC_PY), str(prog)]
    # one pipe for both: the program's report and gdb's lines in their order
    return subprocess.run(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          timeout=300, env=env, cwd=str(tmp_path), stdin=subprocess.DEVNULL)


def test_break_on_capsan_report_error_stops_before_the_report(tmp_path):
    r = gdb_batch(tmp_path, ["break __capsan_report_error", "run", "bt 12", "kill"],
                  "exitcode=0")
    out = r.stdout
    assert re.search(r"Breakpoint 1, (0x[0-9a-f]+ in )?__capsan_report_error", out), out[-3000:]
    # stopped inside the deleter call that made the finding, the report not yet printed
    bt = out[out.index("Breakpoint 1,"):]
    assert "double_delete" in bt and "cs_dl_deleter_tramp" in bt, bt[:3000]
    assert "ERROR: capsan: dlpack-double-delete" not in out[:out.index("Breakpoint 1,")]


def test_abort_on_error_stops_the_debugger_after_the_report(tmp_path):
    r = gdb_batch(tmp_path, ["run", "bt 20"], "abort_on_error=1")
    out = r.stdout
    assert "Program received signal SIGABRT" in out, out[-3000:]
    report = out.index("ERROR: capsan: dlpack-double-delete")
    assert report < out.index("Program received signal SIGABRT"), out[-3000:]
    assert "after the finding" not in out
    # capsan's own crash report stays out of the way: the finding is the report
    assert "capsan: Aborted at pc" not in out


def test_abort_on_error_without_a_debugger_ends_by_sigabrt(tmp_path):
    """No debugger: the process dies by SIGABRT (a core dump where enabled)
    right after printing the report."""
    require_runtime()
    prog = tmp_path / "prog.py"
    prog.write_text(PROG)
    env = base_env({"LD_PRELOAD": str(LIBCAPSAN),
                    "CAPSAN_OPTIONS": f"log_path={tmp_path / 't'}:abort_on_error=1"},
                   interpreter=STATIC_PY)
    r = subprocess.run([str(STATIC_PY), str(prog)], capture_output=True, text=True, timeout=120,
                       env=env, cwd=str(tmp_path), stdin=subprocess.DEVNULL,
                       preexec_fn=lambda: __import__("resource").setrlimit(
                           __import__("resource").RLIMIT_CORE, (0, 0)))
    assert r.returncode == -signal.SIGABRT, (r.returncode, r.stderr[-2000:])
    assert "ERROR: capsan: dlpack-double-delete" in r.stderr
    assert "after the finding" not in r.stdout
