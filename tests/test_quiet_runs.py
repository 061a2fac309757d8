"""Quiet clean runs (issue 34, item 1): as a sanitizer writes its log only
when it has something to say, a process that ends with no finding removes
its trace; one with findings, a crashed one and a killed one keep theirs.
keep_trace=always (capsan run --keep-trace) keeps every trace; log_path
takes %p, and /dev/null and stderr mean no trace file."""
import os
import signal
import subprocess
import textwrap

from conftest import (CAPSAN, FIXDIR, LIBCAPSAN, SCENARIOS, STATIC_PY, base_env, no_core,
                      require_fixtures)

CLEAN = "import numpy as np\na = np.arange(8.0)\nb = np.from_dlpack(a)\nprint('ok', b.sum())\n"


def files(d):
    return sorted(p.name for p in d.iterdir() if p.name.startswith(("t.", "x-")))


def run(d, argv, *, preload=False, options=(), cwd=None):
    require_fixtures()
    e = base_env()
    if preload:
        e["LD_PRELOAD"] = str(LIBCAPSAN)
        e["CAPSAN_OPTIONS"] = ":".join([f"log_path={d / 't'}", *options])
        cmd = argv
    else:
        if options:
            e["CAPSAN_OPTIONS"] = ":".join(options)
        cmd = [str(CAPSAN), "run", "--log-path", str(d / "t"), "--", *argv]
    return subprocess.run(cmd, capture_output=True, text=True, env=e, timeout=120,
                          cwd=cwd or d, stdin=subprocess.DEVNULL, preexec_fn=no_core)


def test_capsan_run_clean_leaves_nothing_and_says_so(tmp_path):
    cp = run(tmp_path, [str(STATIC_PY), "-c", CLEAN])
    assert cp.returncode == 0 and "ok" in cp.stdout, cp.stderr
    assert "capsan: no findings: 1 process traced" in cp.stderr, cp.stderr
    assert files(tmp_path) == [], files(tmp_path)


def test_keep_trace_keeps_the_clean_trace(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir(), b.mkdir()
    cp = subprocess.run([str(CAPSAN), "run", "--keep-trace", "--log-path", str(a / "t"), "--",
                         str(STATIC_PY), "-c", CLEAN], capture_output=True, text=True,
                        env=base_env(), timeout=120)
    assert cp.returncode == 0 and len(files(a)) == 1, (cp.stderr, files(a))
    cp = run(b, [str(STATIC_PY), "-c", CLEAN], options=["keep_trace=always"])
    assert cp.returncode == 0 and len(files(b)) == 1, (cp.stderr, files(b))


def test_findings_keep_their_trace_clean_siblings_do_not(tmp_path):
    """A clean parent and a child that leaks: only the child's trace stays."""
    prog = tmp_path / "parent.py"
    prog.write_text(textwrap.dedent(f"""
        import subprocess, sys
        import numpy as np
        a = np.arange(4.0); b = np.from_dlpack(a)
        subprocess.run([sys.executable, {str(SCENARIOS / 'dl_leak.py')!r}, "consumed"])
    """))
    cp = run(tmp_path, [str(STATIC_PY), str(prog)])
    assert cp.returncode == 0 and "dlpack-leak" in cp.stderr, cp.stderr[-3000:]
    left = files(tmp_path)
    assert len(left) == 1, left
    rep = subprocess.run([str(CAPSAN), "report", str(tmp_path / left[0])], capture_output=True,
                         text=True, timeout=120)
    assert "dlpack-leak" in rep.stdout and "dl_leak.py" in rep.stdout, rep.stdout[-2000:]


def test_bare_preload_removes_its_clean_trace_keeps_one_with_findings(tmp_path):
    clean, leak = tmp_path / "c", tmp_path / "l"
    clean.mkdir(), leak.mkdir()
    cp = run(clean, [str(STATIC_PY), "-c", CLEAN], preload=True)
    assert cp.returncode == 0 and files(clean) == [], (cp.stderr, files(clean))
    cp = run(leak, [str(STATIC_PY), str(SCENARIOS / "dl_leak.py"), "consumed"], preload=True)
    assert cp.returncode == 23 and len(files(leak)) == 1, (cp.stderr, files(leak))


def test_crashed_and_killed_processes_keep_their_trace(tmp_path):
    """Their verdict comes from the trace: both keep it, findings or not."""
    for how, sig in (("os.abort()", signal.SIGABRT),
                     ("os.kill(os.getpid(), signal.SIGKILL)", signal.SIGKILL)):
        d = tmp_path / sig.name
        d.mkdir()
        cp = run(d, [str(STATIC_PY), "-c", CLEAN + f"import os, signal\n{how}\n"])
        assert cp.returncode == 128 + sig, (cp.returncode, cp.stderr[-2000:])
        assert len(files(d)) == 1, (sig, files(d), cp.stderr[-2000:])


def test_pytest_capsan_clean_leaves_nothing(tmp_path):
    suite = tmp_path / "suite"
    suite.mkdir()
    (suite / "test_x.py").write_text(
        "import numpy as np\n\ndef test_roundtrip():\n    a = np.arange(4.0)\n"
        "    assert np.from_dlpack(a).sum() == 6\n")
    e = base_env()
    e["PYTHONPATH"] = f"{FIXDIR.parent / 'python'}:{e.get('PYTHONPATH', '')}"
    for k in ("PYTEST_ADDOPTS", "PYTEST_PLUGINS", "PYTEST_DISABLE_PLUGIN_AUTOLOAD",
              "CAPSAN_OPTIONS"):
        e.pop(k, None)
    cp = subprocess.run([str(STATIC_PY), "-m", "pytest", "-q", "-p", "no:cacheprovider",
                         "--capsan"], capture_output=True, text=True, env=e, cwd=suite,
                        timeout=300, stdin=subprocess.DEVNULL)
    assert cp.returncode == 0 and "1 passed" in cp.stdout, cp.stdout[-3000:] + cp.stderr[-2000:]
    assert [p.name for p in suite.iterdir() if p.name.startswith("capsan.trace")] == [], \
        list(suite.iterdir())


def test_log_path_pid_pattern(tmp_path):
    cp = subprocess.run([str(CAPSAN), "run", "--log-path", str(tmp_path / "x-%p.trace"), "--",
                         str(STATIC_PY), str(SCENARIOS / "dl_leak.py"), "consumed"],
                        capture_output=True, text=True, env=base_env(), timeout=120)
    assert cp.returncode == 23, cp.stderr[-2000:]
    [name] = files(tmp_path)
    assert name.startswith("x-") and name.endswith(".trace") and name[2:-6].isdigit(), name
    assert f"trace written to {tmp_path / name}" in cp.stderr, cp.stderr[-2000:]
    bad = subprocess.run([str(CAPSAN), "run", "--log-path", str(tmp_path / "%p" / "t"), "--",
                          str(STATIC_PY), "-c", "pass"], capture_output=True, text=True,
                         env=base_env(), timeout=60)
    assert bad.returncode == 2 and "%p may only be in the file name" in bad.stderr, bad.stderr


def test_log_path_dev_null_and_stderr_write_no_file(tmp_path):
    for lp in ("/dev/null", "stderr"):
        before = set(os.listdir("/dev"))
        cp = subprocess.run([str(CAPSAN), "run", "--log-path", lp, "--", str(STATIC_PY),
                             str(SCENARIOS / "dl_leak.py"), "consumed"], capture_output=True,
                            text=True, env=base_env(), timeout=120, cwd=tmp_path)
        # the findings still reach stderr, and the status says so
        assert cp.returncode == 23 and "dlpack-leak" in cp.stderr, cp.stderr[-2000:]
        assert "trace written" not in cp.stderr and "no findings" not in cp.stderr, cp.stderr
        assert list(tmp_path.iterdir()) == [] and set(os.listdir("/dev")) == before, lp
