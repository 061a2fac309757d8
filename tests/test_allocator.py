"""capsan.allocator / using / get_handler / set_handler / handler_name and the
ready-made capsan.allocators: numpy's test_mem_policy scenarios under a
Python-callable handler (plain and, with zero findings, under capsan),
alignment of every data pointer, and a second process reading shared memory.
The check_* functions take the interpreter: tests/test_numpy2.py runs them on
the numpy 2 venvs.
"""
from conftest import SCENARIOS, STATIC_PY, findings, run_capsan, summarize
from test_dlpack_ctypes import PYENV, result_of, run_py

POLICY = SCENARIOS / "alloc_mem_policy.py"
READY = SCENARIOS / "alloc_ready.py"
SECRET = "secret_data_allocator"


def check_policy(r: dict):
    # set / get / singleton / using
    assert r["default_name"] == "default_allocator" and r["default_singleton"] is True
    assert r["set_returns_old"] is True and r["get_is_h"] is True
    assert r["current_after_set"] == SECRET and r["restored"] == "default_allocator"
    assert r["using_yields"] is True and r["after_block"] == "default_allocator"
    assert r["owner_name"] == SECRET and r["view_name"] is None and r["version"] == 1
    assert r["owner_after_block"] == SECRET and r["values"] is True
    # views and subclasses: only the owner of the data has a handler
    assert r["subclass"][:4] == [None, None, SECRET, SECRET], r["subclass"]
    # threads start on the default handler; using() works inside them
    assert r["main_during_thread"] == SECRET
    assert r["thread"] == {"thread_default": "default_allocator",
                           "thread_array": "default_allocator", "thread_using": SECRET}
    # asyncio tasks inherit the context they were created in
    assert r["asyncio"] == {"created_inside": SECRET, "created_outside": "default_allocator",
                            "own_using": SECRET, "main_after": "default_allocator"}
    assert r["copied_context"] == SECRET
    # realloc paths, fromiter, concatenate, strings; values intact
    for k in ("resize", "fromiter", "concat", "strings", "resize0"):
        assert r["ops"][k] == SECRET, (k, r["ops"])
    assert r["ops_values"] is True
    # numpy's own exceptions survive frees made while they are pending
    assert r["error_paths"] == ["KeyError", "ValueError", "ValueError"], r["error_paths"]
    # a raising allocator: NULL -> MemoryError, the exception to sys.unraisablehook
    assert r["flaky"] == "MemoryError" and r["flaky_errors"] == 1
    assert r["unraisable"] == [["ZeroDivisionError", "flaky",
                                "<capsan allocator 'flaky': malloc>"]], r["unraisable"]
    # C functions without ctx (libc) and with ctx (numpy's default handler's)
    c = r["c_handlers"]
    assert c[:5] == ["libc_noctx", "libc_noctx", "nep_c", "c-noctx", "c"], c
    assert c[5] == 499500.0 and c[6] == [0.0, 1.0, 2.0]
    # a dropped handler lives exactly as long as its arrays
    lt = r["lifetime"]
    assert lt["alive_with_arrays"] is True and lt["names"] == "short_lived"
    assert lt["sum"] == 4500 and lt["alive_after"] is False and lt["handlers_dropped"] == 1
    # the secret allocator saw every block come back, with its prefix intact
    assert r["secret_live"] == 0
    assert r["stats"]["unknown_frees"] == 0 and r["stats"]["bad_prefix"] == 0
    if r["numpy"].startswith("1."):
        assert r["stats"]["null_frees"] >= 1  # 1.24's np.sort: free(NULL, n); numpy 2 does not
    calls = r["calls"]
    assert calls["malloc"] > 1000 and calls["realloc"] > 400 and calls["calloc"] >= 1
    assert calls["free"] == calls["malloc"] + calls["calloc"] + r["stats"]["null_frees"], calls


def check_mem_policy_plain(tmp_path, py=STATIC_PY):
    cp = run_py(POLICY, tmp_path, interpreter=py)
    assert cp.returncode == 0, cp.stderr
    assert "Exception ignored" not in cp.stderr, cp.stderr
    check_policy(result_of(cp.stdout))


def test_mem_policy_plain(tmp_path):
    check_mem_policy_plain(tmp_path)


def check_mem_policy_under_capsan_clean(tmp_path, py=STATIC_PY):
    res = run_capsan(POLICY, tmp_path, mode="preload", env=PYENV, interpreter=py)
    assert res.returncode == 0, res.describe()
    check_policy(result_of(res.stdout))
    assert res.report is not None, res.describe()
    assert findings(res.report) == [], summarize(res.report)
    p = res.report["processes"][0]
    assert p["summary"]["leaked_bytes"] == 0
    # every block through every handler was an event: thousands of them
    assert p["summary"]["events"] >= 4000, p["summary"]


def test_mem_policy_under_capsan_clean(tmp_path):
    check_mem_policy_under_capsan_clean(tmp_path)


def check_ready(r: dict):
    for align in ("64", "4096"):
        a = r["aligned"][align]
        assert a["misaligned"] == [], (align, a["misaligned"])
        assert a["checked"] >= 140 and a["sorted"] is True
        assert a["name"] == f"aligned{align}" and a["resize_name"] == f"aligned{align}"
    s = r["shm"]
    assert s["path"].startswith("/dev/shm/capsan_test_")
    assert s["names"][0].startswith("shared_memory:capsan_test_") and all(s["inside"])
    assert s["child_rc"] == 0, s["child_stderr"]
    # the child read what the parent wrote, and the parent sees the child's write
    ps, cs = s["parent_sums"], s["child_sums"]
    assert cs[0] == ps[0] == 4999950000.0 and cs[2] == ps[2] == 499500.0
    assert cs[1] == 448.0 and ps[1] == 448.0 + 12345 and s["child_write_seen"] == 12345
    assert cs[3] == ps[3] == 224.0  # a strided view
    assert s["used_after_free"] < s["used_before_free"]
    assert s["too_big"] == "MemoryError"
    # the mapping (and the /dev/shm file) lives as long as an array uses it
    assert s["file_while_array_lives"] is True and s["y_still_readable"] == 448
    assert s["file_after"] is False
    assert r["live_handlers"] == 0


def check_ready_made_plain(tmp_path, py=STATIC_PY):
    cp = run_py(READY, tmp_path, interpreter=py)
    assert cp.returncode == 0, cp.stderr
    check_ready(result_of(cp.stdout))


def test_ready_made_plain(tmp_path):
    check_ready_made_plain(tmp_path)


def check_ready_made_under_capsan_clean(tmp_path, py=STATIC_PY):
    res = run_capsan(READY, tmp_path, mode="preload", env=PYENV, interpreter=py)
    assert res.returncode == 0, res.describe()
    check_ready(result_of(res.stdout))
    assert res.report is not None, res.describe()
    assert len(res.report["processes"]) == 2, summarize(res.report)  # the reader too
    assert findings(res.report) == [], summarize(res.report)


def test_ready_made_under_capsan_clean(tmp_path):
    check_ready_made_under_capsan_clean(tmp_path)


def check_declared_device_reaches_the_runtime(tmp_path, py=STATIC_PY):
    """allocator(device="cuda_host") tells the runtime (capsan_handler_set_device):
    exporting its memory as CPU is a dlpack-device-mismatch, with both lines."""
    import json
    import subprocess
    from conftest import ROOT, base_env, fixdir_for, marker_line
    script = SCENARIOS / "alloc_device.py"
    env = base_env({"CAPSAN_OPTIONS": f"log_path={tmp_path / 't'}:report=none"})
    env["PYTHONPATH"] = f"{fixdir_for(py)}:{ROOT / 'build' / 'python'}"
    r = subprocess.run([str(py), str(script)], capture_output=True, text=True, timeout=120,
                       env=env)
    assert r.returncode == 0, r.stderr
    got = json.loads(r.stdout.strip().splitlines()[-1])
    kinds = [k for k, _ in got]
    assert kinds == ["dlpack-device-mismatch"], got
    lines = {tuple(x) for x in got[0][1]}
    assert ("alloc_device.py", marker_line(script, "export")) in lines, got
    assert ("alloc_device.py", marker_line(script, "alloc")) in lines, got


def test_declared_device_reaches_the_runtime(tmp_path):
    check_declared_device_reaches_the_runtime(tmp_path)
