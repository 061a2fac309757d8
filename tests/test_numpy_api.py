"""The importable package: `import capsan` finds and starts the one runtime
of the process (never a second copy), and capsan.trace() / Trace /
Finding behave as DESIGN.md's user contract says. Each case runs in its own
interpreter (the runtime patches the process it lives in)."""
import shutil
import subprocess
import sys
import textwrap

from conftest import LIBCAPSAN, SCENARIOS, STATIC_PY, base_env, marker_line, no_core

sys.path.insert(0, str(SCENARIOS))
from np_testlib import PYDIR, api_env, require_np, run_api  # noqa: E402


def py(code, tmp, *, env=None, interpreter=STATIC_PY, preload=False, options=()):
    """Run a code snippet with the package on the path; returns CompletedProcess."""
    require_np()
    tmp.mkdir(parents=True, exist_ok=True)
    path = tmp / f"snippet_{len(list(tmp.glob('snippet_*.py')))}.py"
    if code.startswith(MAPS):
        code = MAPS + textwrap.dedent(code[len(MAPS):])
    path.write_text(textwrap.dedent(code))
    e = api_env(tmp, options, env)
    if preload:
        e["LD_PRELOAD"] = str(LIBCAPSAN)
    return subprocess.run([str(interpreter), str(path)], capture_output=True, text=True,
                          env=e, timeout=120, stdin=subprocess.DEVNULL, preexec_fn=no_core,
                          cwd=str(tmp)), path


def ok(cp):
    assert cp.returncode == 0, f"rc={cp.returncode}\n--- stdout\n{cp.stdout}\n--- stderr\n{cp.stderr}"
    return cp.stdout


MAPS = """
def copies():
    with open("/proc/self/maps") as f:
        return sorted({l.split(None, 5)[5].strip() for l in f
                       if len(l.split(None, 5)) == 6 and "libcapsan" in l})
"""


# ---------------------------------------------------------------- finding the runtime

def test_import_loads_the_build_tree_runtime(tmp_path, interp):
    out = ok(py(MAPS + """
        import capsan
        print("path", capsan.library_path)
        print("active", capsan.active(), "preloaded", capsan.preloaded())
        print("copies", copies())
    """, tmp_path, interpreter=interp)[0])
    assert f"path {LIBCAPSAN}" in out, out
    assert "active True preloaded False" in out, out
    assert f"copies {[str(LIBCAPSAN)]}" in out, out


def test_import_under_preload_uses_the_preloaded_runtime(tmp_path):
    """LD_PRELOAD'ed runtime: `import capsan` binds it; CAPSAN_LIB naming
    another copy is ignored (with a warning), never loaded beside it."""
    other = tmp_path / "elsewhere" / "libcapsan.so"
    other.parent.mkdir()
    shutil.copy(LIBCAPSAN, other)
    cp, _ = py(MAPS + """
        import warnings
        warnings.simplefilter("always")
        import capsan
        print("path", capsan.library_path)
        print("active", capsan.active(), "preloaded", capsan.preloaded())
        print("copies", copies())
    """, tmp_path, preload=True, env={"CAPSAN_LIB": str(other)})
    out = ok(cp)
    assert f"path {LIBCAPSAN}" in out, out
    assert "active True preloaded True" in out, out
    assert f"copies {[str(LIBCAPSAN)]}" in out, out
    assert "CAPSAN_LIB" in cp.stderr and "ignored" in cp.stderr, cp.stderr


def test_capsan_lib_override(tmp_path):
    other = tmp_path / "elsewhere" / "libcapsan.so"
    other.parent.mkdir()
    shutil.copy(LIBCAPSAN, other)
    out = ok(py(MAPS + """
        import capsan
        print("path", capsan.library_path)
        print("copies", copies())
    """, tmp_path, env={"CAPSAN_LIB": str(other)})[0])
    assert f"path {other}" in out and f"copies {[str(other)]}" in out, out


def test_already_loaded_local_copy_is_reused(tmp_path):
    """Somebody dlopen'ed the runtime RTLD_LOCAL (not in the global scope):
    `import capsan` finds it in the process's mappings and binds that one."""
    other = tmp_path / "elsewhere" / "libcapsan.so"
    other.parent.mkdir()
    shutil.copy(LIBCAPSAN, other)
    out = ok(py(MAPS + f"""
        import ctypes, os
        ctypes.CDLL({str(other)!r}, mode=os.RTLD_LOCAL)
        import capsan
        print("path", capsan.library_path)
        print("copies", copies())
    """, tmp_path)[0])
    assert f"path {other}" in out and f"copies {[str(other)]}" in out, out


def test_missing_runtime_is_a_clear_import_error(tmp_path):
    pkg = tmp_path / "pkg"
    shutil.copytree(PYDIR / "capsan", pkg / "capsan")
    cp = subprocess.run([str(STATIC_PY), "-c", "import capsan"], capture_output=True, text=True,
                        env=dict(base_env(), PYTHONPATH=str(pkg)), timeout=60)
    assert cp.returncode != 0
    assert "CapsanLoadError" in cp.stderr and "libcapsan.so not found" in cp.stderr, cp.stderr
    cp = subprocess.run([str(STATIC_PY), "-c", "try:\n import capsan\nexcept ImportError as e:"
                         "\n print('import error', e)"], capture_output=True, text=True,
                        env=dict(base_env(), PYTHONPATH=str(pkg)), timeout=60)
    assert "import error capsan: libcapsan.so not found" in cp.stdout, (cp.stdout, cp.stderr)


# ---------------------------------------------------------------- trace()

def test_trace_findings_repr_report_and_assert_clean(tmp_path):
    cp, path = py("""
        import json, numpy as np, capsan, np_leaky as L

        def leak():
            a = np.ones(1000)  # <-- alloc
            L.keep_forever(a)

        before = np.core.multiarray.get_handler_name()
        with capsan.trace() as t:
            inside = np.core.multiarray.get_handler_name()
            leak()
        after = np.core.multiarray.get_handler_name()
        print("names", before, inside, after)
        f, = t.findings
        print("kind", f.kind, f.severity, f.bytes, f.count)
        ev = f.events[0]
        print("event", ev.event, ev.thread, ev.time_ns > 0, len(ev.stack) > 0, f.stack is ev.stack)
        print("repr", repr(f))
        print("at", f.at, f.frame.function)
        txt = t.report()
        print("TEXT<<" + txt + ">>")
        rep = json.loads(t.report(format="json"))
        print("json", rep["tool"], rep["format"], len(rep["processes"][0]["findings"]),
              rep["processes"][0]["summary"]["leaked_bytes"])
        try:
            t.assert_clean()
        except AssertionError as e:
            print("ASSERT<<" + str(e) + ">>")
        t.assert_clean(allow=["numpy-leak"])
        t.assert_clean(allow=["leak"])
        t.assert_clean(allow=["numpy-*"])
        print("allowed ok")
    """, tmp_path)
    out = ok(cp)
    line = marker_line(path, "alloc")
    assert "names default_allocator capsan(default_allocator) default_allocator" in out, out
    assert "kind numpy-leak error 8000 1" in out, out
    assert "event alloc 1 True True True" in out, out
    assert f"repr Finding(kind='numpy-leak', bytes=8000, at='{path.name}:{line}')" in out, out
    assert f"at {path.name}:{line} leak" in out, out
    text = out.split("TEXT<<")[1].split(">>")[0]
    assert "ERROR: capsan: numpy-leak:" in text and "allocated at (thread T1):" in text, text
    assert f"{path}:{line} in leak" in text, text
    assert "SUMMARY: capsan: 1 error(s), 0 warning(s) [numpy-leak: 1]; 8000 byte(s) leaked" in text
    assert "json capsan 1 1 8000" in out, out
    msg = out.split("ASSERT<<")[1].split(">>")[0]
    assert msg.startswith("capsan: 1 finding(s) in the traced scope"), msg
    assert f"{path}:{line} in leak" in msg and "SUMMARY: capsan:" in msg, msg
    assert "allowed ok" in out


def test_trace_restores_the_handler_on_exceptions(tmp_path):
    out = ok(py("""
        import numpy as np, capsan
        name = np.core.multiarray.get_handler_name
        t = capsan.trace()
        try:
            with t:
                a = np.ones(100)
                raise KeyError("boom")
        except KeyError:
            print("raised through")
        print("after", name())
        print("findings", t.findings)   # leaks are not judged when the scope raised
        del a
        # nested scopes restore in order
        with capsan.trace() as outer:
            n1 = name()
            with capsan.trace() as inner:
                n2 = name()
            n3 = name()
        print("nested", n1, n2, n3, name())
        print("nested findings", outer.findings, inner.findings)
    """, tmp_path)[0])
    assert "raised through" in out and "after default_allocator" in out, out
    assert "findings []" in out.splitlines(), out
    assert ("nested capsan(default_allocator) capsan(capsan(default_allocator)) "
            "capsan(default_allocator) default_allocator") in out, out
    assert "nested findings [] []" in out, out


def test_trace_as_decorator(tmp_path):
    out = ok(py("""
        import asyncio, numpy as np, capsan, np_leaky as L

        @capsan.trace()
        def clean(n):
            return float(np.arange(n).sum())

        @capsan.trace()
        def leaky():
            L.keep_forever(np.zeros(10))

        lenient = capsan.trace(check=False)

        @lenient
        def leaky2():
            L.keep_forever(np.zeros(20))

        @capsan.trace()
        async def aclean():
            await asyncio.sleep(0)
            return np.arange(5).sum()

        print("clean", clean(10), clean.capsan_trace.findings)
        try:
            leaky()
        except AssertionError as e:
            print("raised", "numpy-leak" in str(e))
        leaky2(); leaky2()
        print("accumulated", [f.bytes for f in lenient.findings])
        print("async", asyncio.run(aclean()))
    """, tmp_path)[0])
    assert "clean 45.0 []" in out, out
    assert "raised True" in out, out
    assert "accumulated [160, 160]" in out, out
    assert "async 10" in out, out


def test_trace_collects_dlpack_findings_too(tmp_path):
    """Findings of every kind reported while the scope is open belong to it
    (a DLPack double delete, skipped with protect=1), none from before it."""
    cp, path = py("""
        import numpy as np, capsan, dlproducer as P, dlconsumer as C
        C.double_delete(P.good(4))          # <-- before the scope: not in it
        with capsan.trace() as t:
            C.double_delete(P.good(4))      # <-- in scope
        print("kinds", sorted(f.kind for f in t.findings))
        print("at", [f.at for f in t.findings])
        print("all", sorted(f.at for f in capsan.findings()))
    """, tmp_path, options=["protect=1"])
    out = ok(cp)
    before = f"{path.name}:{marker_line(path, 'before the scope: not in it')}"
    inside = f"{path.name}:{marker_line(path, 'in scope')}"
    assert "kinds ['dlpack-double-delete']" in out, out
    # the same kind twice: the line tells the scope's finding from the earlier one
    assert f"at ['{inside}']" in out.splitlines(), out
    assert f"all {sorted([before, inside])}" in out.splitlines(), out


def test_handler_wraps_a_given_inner_handler(tmp_path):
    out = ok(py("""
        import numpy as np, capsan, np_aligned as A
        h = capsan.handler(A.handler())
        old = capsan.set_handler(h)
        a = np.ones(100)
        print("aligned", A.aligned(a), np.core.multiarray.get_handler_name(a))
        del a
        capsan.set_handler(old)
        print("back", np.core.multiarray.get_handler_name(), capsan.get_handler() is old)
    """, tmp_path)[0])
    assert "aligned True capsan(aligned64_allocator)" in out, out
    assert "back default_allocator True" in out, out


def test_stop_restores_and_keeps_working(tmp_path):
    out = ok(py("""
        import numpy as np, capsan, np_leaky as L
        print("active", capsan.active())
        with capsan.trace() as t:
            a = np.ones(10)
            capsan.stop()
            print("stopped", capsan.active())
            del a
            b = np.ones(10)
            L.keep_forever(b)
            del b
        print("findings after stop", t.findings)
    """, tmp_path)[0])
    assert "active True" in out and "stopped False" in out, out
    assert "findings after stop []" in out, out


def test_api_works_under_both_interpreters(tmp_path, interp):
    r = run_api(SCENARIOS / "np_leak.py", tmp_path, args=["keep"], interpreter=interp)
    assert r.returncode == 0, r.describe()
    assert [f["kind"] for f in r.findings] == ["numpy-leak"], r.describe()


def test_threads_are_judged_in_the_scope_context_only(tmp_path):
    """NumPy's handler is per context and a thread starts in a fresh one:
    arrays kept by threads the scope started are judged only when the
    threads run in a copy of the scope's context (as docs/python.md says)."""
    out = ok(py("""
        import contextvars, threading
        import numpy as np, capsan
        keep = []
        def work():
            for _ in range(5):
                keep.append(np.ones(50))
        for copy in (False, True):
            with capsan.trace(check=False) as t:
                ts = [threading.Thread(target=contextvars.copy_context().run if copy else work,
                                       args=(work,) if copy else ()) for _ in range(3)]
                [x.start() for x in ts]
                [x.join() for x in ts]
            print("copy", copy, len(t.findings), sorted({f.kind for f in t.findings}))
    """, tmp_path)[0])
    assert "copy False 0 []" in out, out
    assert "copy True 15 ['numpy-leak']" in out, out


def test_python_m_capsan_runs_the_command(tmp_path):
    """`python -m capsan ...` is the capsan command beside the runtime the
    package found (as `python -m memray`); it traces nothing itself, while
    a program run with `python -m` that imports capsan still starts it."""
    require_np()
    env = api_env(tmp_path, (), None)
    env["CAPSAN_OPTIONS"] = f"log_path={tmp_path / 'cmd'}"
    cp = subprocess.run([str(STATIC_PY), "-m", "capsan", "--version"], capture_output=True,
                        text=True, env=env, timeout=120, cwd=str(tmp_path))
    assert cp.returncode == 0 and cp.stdout.startswith("capsan "), (cp.stdout, cp.stderr)
    assert not list(tmp_path.glob("cmd.*")), "python -m capsan traced itself"
    (tmp_path / "leaky_mod.py").write_text(textwrap.dedent("""
        import numpy as np, capsan
        keep = []
        with capsan.trace(check=False) as t:
            keep.append(np.ones(10))
        print("findings", [f.kind for f in t.findings])
    """))
    cp = subprocess.run([str(STATIC_PY), "-m", "leaky_mod"], capture_output=True, text=True,
                        env={**env, "PYTHONPATH": f"{tmp_path}:{env['PYTHONPATH']}"}, timeout=120,
                        cwd=str(tmp_path))
    assert cp.returncode == 0 and "findings ['numpy-leak']" in cp.stdout, (cp.stdout, cp.stderr)
