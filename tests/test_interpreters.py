"""The two interpreter builds (Debian's static-libpython /usr/bin/python3 and
the shared-libpython build/tests/pyshared), the two ways of loading the
runtime (`capsan run` and a bare LD_PRELOAD), and process handling (children,
exec, exit statuses, processes without events).

On the static build symbol interposition alone sees nothing (DESIGN.md):
identical findings on both builds show that the GOT patching works.
"""
import subprocess

import pytest

from conftest import (CAPSAN, DEFAULT_EXITCODE, INTERPRETERS, LIBCAPSAN, PYSHARED,
                      SCENARIOS, STATIC_PY, base_env, capsan_report, findings, innermost_python, is_signal,
                      kinds, marker_line, require, require_fixtures, require_runtime,
                      run_capsan, trace_files)

S = SCENARIOS


def test_pyshared_links_libpython_and_sees_dist_packages():
    require_fixtures()
    ldd = subprocess.run(["ldd", str(PYSHARED)], capture_output=True, text=True, timeout=30).stdout
    assert "libpython3.11.so" in ldd, ldd
    ldd_static = subprocess.run(["ldd", str(STATIC_PY)], capture_output=True, text=True,
                                timeout=30).stdout
    assert "libpython" not in ldd_static, "/usr/bin/python3 is expected to be static-libpython"
    code = ("import sys, numpy, torch, dlproducer, dlconsumer;"
            "print(sys.prefix, sys.version_info[:2], numpy.__version__, torch.__version__)")
    for interp in INTERPRETERS.values():
        cp = subprocess.run([str(interp), "-c", code], capture_output=True, text=True,
                            env=base_env(), timeout=60)
        assert cp.returncode == 0, cp.stderr
        assert cp.stdout.startswith("/usr (3, 11) 1.24"), cp.stdout


def signature(res, script):
    """What must agree between runs: (kind, severity, event names, innermost
    script lines of the events)."""
    out = set()
    for f in findings(res.report):
        evs = []
        for ev in f["events"]:
            top = innermost_python(ev)
            line = top[1] if top and top[0] == script.name else None
            evs.append((ev["event"], line))
        out.add((f["kind"], f["severity"], tuple(evs)))
    return out


SCEN = [
    ("dl_double_delete.py", ["legacy"], ["protect=1"]),
    ("dl_leak.py", ["consumed"], []),
    ("dl_reconsume.py", [], []),
    ("dl_not_renamed.py", [], ["protect=1"]),
    ("dl_byte_offset.py", ["object"], []),
]


@pytest.mark.parametrize("name,args,opts", SCEN, ids=[s[0][:-3] for s in SCEN])
def test_same_findings_on_both_interpreters(tmp_path, name, args, opts):
    script = S / name
    sigs = {}
    for key, interp in INTERPRETERS.items():
        res = run_capsan(script, tmp_path / key, options=opts, interpreter=interp, args=args)
        assert res.returncode == DEFAULT_EXITCODE, res.describe()
        sigs[key] = signature(res, script)
        assert sigs[key], res.describe()
    assert sigs["static"] == sigs["shared"], sigs


@pytest.mark.parametrize("name,args,opts", SCEN[:3], ids=[s[0][:-3] for s in SCEN[:3]])
def test_bare_preload_agrees_with_capsan_run(tmp_path, interp, name, args, opts):
    script = S / name
    a = run_capsan(script, tmp_path / "run", options=opts, interpreter=interp, args=args)
    b = run_capsan(script, tmp_path / "pre", options=opts, interpreter=interp, args=args,
                   mode="preload")
    assert a.returncode == b.returncode == DEFAULT_EXITCODE, a.describe() + b.describe()
    assert signature(a, script) == signature(b, script)
    assert signature(a, script), a.describe()


def test_grandchild_through_a_shell_is_traced(tmp_path, interp):
    """`capsan run -- sh -c 'python3 x.py'`: the runtime follows children; the
    shell itself produces no events and leaves no trace file."""
    require_runtime()
    script = S / "dl_leak.py"
    cmd = [str(CAPSAN), "run", "--log-path", str(tmp_path / "t"), "--", "/bin/sh", "-c",
           f"'{interp}' '{script}' consumed; echo shell-after=$?"]
    cp = subprocess.run(cmd, capture_output=True, text=True, env=base_env(), timeout=120)
    traces = trace_files(tmp_path)
    assert len(traces) == 1, (traces, cp.stderr)
    # the python process exits 23; the shell goes on and exits 0
    assert f"shell-after={DEFAULT_EXITCODE}" in cp.stdout, cp.stdout + cp.stderr
    assert "dlpack-leak" in cp.stderr
    _, rep = capsan_report(traces)
    assert kinds(rep) == {"dlpack-leak"}
    p = rep["processes"][0]
    assert any("dl_leak.py" in a for a in p["argv"]), p["argv"]
    line = marker_line(script, "consume")
    assert any(innermost_python(ev) == ("dl_leak.py", line)
               for f in findings(rep) for ev in f["events"])


def test_exec_from_python_is_traced(tmp_path):
    """A Python process that exec()s another Python: the new image is traced too."""
    code = (f"import os\nos.execv({str(STATIC_PY)!r}, [{str(STATIC_PY)!r}, "
            f"{str(S / 'dl_reconsume.py')!r}])\n")
    res = run_capsan(code, tmp_path)
    assert res.returncode == DEFAULT_EXITCODE, res.describe()
    assert kinds(res.report) == {"dlpack-reconsume"}


def test_process_without_events_leaves_no_trace(tmp_path):
    require_runtime()
    for i, argv in enumerate([["/bin/sh", "-c", "exit 7"],
                              [str(STATIC_PY), "-c", "import sys; sys.exit(7)"],
                              [str(PYSHARED), "-c", "import sys; sys.exit(7)"]]):
        d = tmp_path / str(i)
        d.mkdir()
        cp = subprocess.run([str(CAPSAN), "run", "--log-path", str(d / "t"), "--", *argv],
                            capture_output=True, text=True, env=base_env(), timeout=60)
        assert cp.returncode == 7, (argv, cp.returncode, cp.stderr)
        assert trace_files(d) == [], (argv, list(d.iterdir()))
        assert "ERROR" not in cp.stderr, cp.stderr


def test_capsan_run_passes_signal_death_through(tmp_path):
    require_runtime()
    cp = subprocess.run([str(CAPSAN), "run", "--log-path", str(tmp_path / "t"), "--",
                         str(STATIC_PY), "-c", "import os, signal; os.kill(os.getpid(), signal.SIGTERM)"],
                        capture_output=True, text=True, env=base_env(), timeout=60)
    assert is_signal(cp.returncode, 15), cp.returncode


def test_capsan_run_missing_program(tmp_path):
    require_runtime()
    cp = subprocess.run([str(CAPSAN), "run", "--log-path", str(tmp_path / "t"), "--",
                         str(tmp_path / "no-such-program")], capture_output=True, text=True,
                        timeout=30)
    assert cp.returncode != 0
    assert "no-such-program" in cp.stderr, cp.stderr


def test_runtime_exports_only_capsan_symbols():
    """Guest manners: libcapsan.so must not put libunwind's or anyone's symbols
    in front of the host's (only capsan's own entry points and the interposed
    Python/libc functions)."""
    require(LIBCAPSAN)
    out = subprocess.run(["nm", "-D", "--defined-only", str(LIBCAPSAN)], capture_output=True,
                         text=True, timeout=30).stdout
    syms = [line.split()[-1] for line in out.splitlines() if line.strip()]
    bad = [s for s in syms if s.startswith(("_U", "unw_", "backtrace"))]
    assert not bad, bad
    needed = subprocess.run(["readelf", "-d", str(LIBCAPSAN)], capture_output=True, text=True,
                            timeout=30).stdout
    assert "libunwind" not in needed, "libcapsan.so must not link libunwind.so (DESIGN: guest manners)"
    assert "libpython" not in needed, "the runtime must not link libpython"
