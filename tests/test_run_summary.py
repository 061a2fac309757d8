"""A clean run says what it watched (issue 20, item 8): `capsan run`
prints one line at the end, over all its processes, when none reported a
finding; a bare LD_PRELOAD stays silent as the sanitizers are, unless
verbosity=1 asks."""
import re
import subprocess

from conftest import (SCENARIOS, CAPSAN, STATIC_PY, base_env, findings, marker_line,
                      require_fixtures, run_capsan, summarize)

LINE = re.compile(r"^capsan: no findings: (\d+) process(?:es)? traced, (\d+) tensors?, "
                  r"(\d+) NumPy blocks? and (\d+) Arrow structs? watched \((\d+) events\)$", re.M)


def test_clean_run_says_what_it_watched(tmp_path):
    res = run_capsan(SCENARIOS / "clean_roundtrip.py", tmp_path)
    assert res.returncode == 0 and findings(res.report) == [], res.describe()
    m = LINE.search(res.stderr)
    assert m, res.stderr[-3000:]
    procs, tensors, blocks, arrow, events = map(int, m.groups())
    # 7 arrays to torch and back, each way one export; no Arrow
    assert procs == 1 and tensors >= 14 and blocks > 0 and arrow == 0 and events >= tensors, \
        m.group(0)
    assert res.stderr.rstrip().endswith(m.group(0)), res.stderr[-2000:]


def test_forked_processes_are_summed(tmp_path):
    res = run_capsan(SCENARIOS / "clean_fork.py", tmp_path)
    assert res.returncode == 0 and findings(res.report) == [], res.describe()
    m = LINE.search(res.stderr)
    assert m and int(m.group(1)) == 2 and int(m.group(2)) >= 150, res.stderr[-3000:]


def test_a_run_with_findings_has_no_such_line(tmp_path):
    res = run_capsan(SCENARIOS / "dl_leak.py", tmp_path, args=["consumed"])
    assert res.returncode == 23 and findings(res.report, "dlpack-leak"), res.describe()
    assert "no findings" not in res.stderr, res.stderr[-3000:]


def test_nothing_watched_is_said(tmp_path):
    cp = subprocess.run([str(CAPSAN), "run", "--log-path", str(tmp_path / "t"), "--",
                         str(STATIC_PY), "-c", "print('hi')"], capture_output=True, text=True,
                        env=base_env(), timeout=60)
    assert cp.returncode == 0 and cp.stdout == "hi\n", cp.stderr
    assert "capsan: no findings: no process made a DLPack, NumPy or Arrow event" in cp.stderr, \
        cp.stderr


def test_bare_preload_is_silent_unless_asked(tmp_path):
    quiet = run_capsan(SCENARIOS / "clean_roundtrip.py", tmp_path / "q", mode="preload")
    assert quiet.returncode == 0 and "no findings" not in quiet.stderr, quiet.describe()
    loud = run_capsan(SCENARIOS / "clean_roundtrip.py", tmp_path / "v", mode="preload",
                      options=["verbosity=1"])
    assert re.search(r"==\d+==capsan: no findings: \d+ tensor\(s\), \d+ NumPy block\(s\) and "
                     r"0 Arrow struct\(s\) watched \(\d+ events\)", loud.stderr), loud.stderr[-3000:]
    assert findings(loud.report) == [], summarize(loud.report)


def test_clean_arrow_run_counts_its_structs(tmp_path):
    """The Arrow structs exported are counted, stream chunks included: the
    arrowfx clean case exports 15 (three (schema, array) pairs consumed; a
    stream, its get_schema result and its 3 chunks; a (schema, device
    array) pair; a pair nobody consumed). The live line (verbosity=1) says
    the same number."""
    require_fixtures()
    res = run_capsan(SCENARIOS / "ar_fixtures.py", tmp_path / "r", args=["clean"])
    assert res.returncode == 0 and findings(res.report) == [], res.describe()
    m = LINE.search(res.stderr)
    assert m and int(m.group(4)) == 15 and int(m.group(2)) == 0, res.stderr[-3000:]
    loud = run_capsan(SCENARIOS / "ar_fixtures.py", tmp_path / "v", args=["clean"],
                      mode="preload", options=["verbosity=1"])
    assert re.search(r"==\d+==capsan: no findings: 0 tensor\(s\), 0 NumPy block\(s\) and "
                     r"15 Arrow struct\(s\) watched", loud.stderr), loud.stderr[-3000:]


OLD_END = """
import os, struct, sys, time
# a trace of an older writer, whose END ends before `arrow` (64 bytes)
pid = 1 << 22
hdr = struct.pack("<8sIIQQQQ2Q", b"CAPSANTR", 2, 64, pid, os.getpid(), time.time_ns(), 1, 0, 0)
end = struct.pack("<IiQQQQQQII", 1, 0, 2, 0, 0, 9, 5, 7, 0, 0)
rec = struct.pack("<HHI", 8, 0, 8 + len(end)) + end
open(sys.argv[1] + "." + str(pid), "wb").write(hdr + rec + bytes(8))
"""


def test_older_end_records_still_summed(tmp_path):
    """A trace whose END predates the Arrow count is read as 0 Arrow structs:
    the run's line sums its tensors and blocks with the others'."""
    log = tmp_path / "t"
    cp = subprocess.run([str(CAPSAN), "run", "--log-path", str(log), "--",
                         str(STATIC_PY), "-c", OLD_END, str(log)], capture_output=True, text=True,
                        env=base_env(), timeout=60)
    assert cp.returncode == 0, cp.stderr
    m = LINE.search(cp.stderr)
    assert m and m.group(1) == "1" and m.groups()[1:4] == ("5", "7", "0"), cp.stderr


def test_a_child_killed_unseen_is_reported_by_the_run(tmp_path):
    """A child its parent killed with SIGTERM ends without an END and
    without printing: `capsan run` replays its trace (what was still alive
    when it was killed, at its lines), says which process it was, and
    still gives the parent's clean line, for the processes that ended."""
    script = SCENARIOS / "killed_child_holds.py"
    res = run_capsan(script, tmp_path)
    m = re.search(r"parent done (\d+)", res.stdout)
    assert m and res.returncode == 0, res.describe()
    child = m.group(1)
    err = res.stderr
    assert re.search(rf"capsan: process {child} ended without capsan seeing it end \(killed by a "
                     rf"signal such as SIGTERM or SIGKILL, or still running\); trace: \S+\.{child}",
                     err), err[-3000:]
    assert f"=={child}==WARNING: capsan:" in err and "when the process was killed" in err, err[-3000:]
    for tag in ("child-array", "child-export"):
        assert f"killed_child_holds.py:{marker_line(script, tag)} in <module>" in err, err[-3000:]
    assert re.search(r"^capsan: no findings in the processes that ended: 1 process traced",
                     err, re.M), err[-3000:]
    assert err.index(f"process {child} ended without") < err.index("no findings in the"), err
