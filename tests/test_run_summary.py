"""A clean run says what it watched (issue 20, item 8): `capsan run`
prints one line at the end, over all its processes, when none reported a
finding; a bare LD_PRELOAD stays silent as the sanitizers are, unless
verbosity=1 asks."""
import re
import subprocess

from conftest import SCENARIOS, CAPSAN, STATIC_PY, base_env, findings, run_capsan, summarize

LINE = re.compile(r"^capsan: no findings: (\d+) process(?:es)? traced, (\d+) tensors? and "
                  r"(\d+) NumPy blocks? watched \((\d+) events\)$", re.M)


def test_clean_run_says_what_it_watched(tmp_path):
    res = run_capsan(SCENARIOS / "clean_roundtrip.py", tmp_path)
    assert res.returncode == 0 and findings(res.report) == [], res.describe()
    m = LINE.search(res.stderr)
    assert m, res.stderr[-3000:]
    procs, tensors, blocks, events = map(int, m.groups())
    # 7 arrays to torch and back, each way one export
    assert procs == 1 and tensors >= 14 and blocks > 0 and events >= tensors, m.group(0)
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
    assert "capsan: no findings: no process made a DLPack or NumPy event" in cp.stderr, cp.stderr


def test_bare_preload_is_silent_unless_asked(tmp_path):
    quiet = run_capsan(SCENARIOS / "clean_roundtrip.py", tmp_path / "q", mode="preload")
    assert quiet.returncode == 0 and "no findings" not in quiet.stderr, quiet.describe()
    loud = run_capsan(SCENARIOS / "clean_roundtrip.py", tmp_path / "v", mode="preload",
                      options=["verbosity=1"])
    assert re.search(r"==\d+==capsan: no findings: \d+ tensor\(s\) and \d+ NumPy block\(s\) "
                     r"watched \(\d+ events\)", loud.stderr), loud.stderr[-3000:]
    assert findings(loud.report) == [], summarize(loud.report)
