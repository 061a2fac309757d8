"""capsan.dlpack: DLPack structures and capsules built in pure Python.

The scenario builds capsules with ctypes only and round-trips them through
torch.from_dlpack (raw capsule), np.from_dlpack (an object with __dlpack__)
and the C fixture consumer (versioned), checking the data and that every
deleter runs exactly once, including on a worker thread (torch 1.13 calls
foreign deleters without the GIL) and when a consumer fails with its
exception pending. It must also be clean under capsan.
"""
import json
import subprocess
from pathlib import Path

from conftest import (BUILD, FIXDIR, SCENARIOS, STATIC_PY, base_env, findings, no_core, require,
                      run_capsan, summarize)

SCRIPT = SCENARIOS / "describe_dlpack_roundtrip.py"
PYENV = {"PYTHONPATH": f"{BUILD / 'python'}:{FIXDIR}"}


def run_py(script, tmp_path, *args, interpreter=STATIC_PY, timeout=120):
    """The script without LD_PRELOAD (import capsan still loads the runtime):
    cwd is tmp_path so trace files land there."""
    require(BUILD / "python" / "capsan" / "dlpack.py", FIXDIR / "dlconsumer.so")
    return subprocess.run([str(interpreter), str(script), *map(str, args)], cwd=tmp_path,
                          capture_output=True, text=True, timeout=timeout,
                          env=base_env(PYENV), stdin=subprocess.DEVNULL, preexec_fn=no_core)


def result_of(stdout: str) -> dict:
    lines = [ln for ln in stdout.splitlines() if ln.startswith("RESULT ")]
    assert len(lines) == 1, f"no RESULT line in:\n{stdout[-3000:]}"
    return json.loads(lines[0][len("RESULT "):])


def check_roundtrip(r: dict):
    assert r["sizes"] == {"DLDevice": 8, "DLDataType": 4, "DLTensor": 48, "DLManagedTensor": 64,
                          "DLPackVersion": 8, "DLManagedTensorVersioned": 80}
    # torch: raw capsule, renamed, data shared, deleter once, only after the tensor died
    assert r["name_before"] == "dltensor"
    assert r["torch_name_after"] == "used_dltensor"
    assert r["torch_equal"] and r["torch_shares"]
    assert r["torch_deleted_while_alive"] == 0 and r["torch_deleted"] == 1
    # numpy: through __dlpack__, strided view kept
    assert r["numpy_equal"]
    assert r["numpy_deleted_while_alive"] == 0 and r["numpy_deleted"] == 1
    assert r["bytes_values"] == [0, 1, 2, 3]
    assert r["bytes_resize_blocked"] is True and r["bytes_deleted"] == 1
    assert r["offset_values"] == [2.0, 3.0, 4.0, 5.0, 6.0, 7.0]
    # deleter from a thread without the GIL, destructor of an unconsumed capsule
    assert r["thread_deleted"] == 1
    assert r["dropped_deleted"] == 1
    # failing consumer: its own exception, not a SystemError, and no leak
    assert r["refused_error"] == "RuntimeError: Unsupported dtype in DLTensor.", r["refused_error"]
    assert r["refused_deleted"] == 1
    # versioned
    vr = r["versioned_read"]
    assert vr["name"] == "dltensor_versioned" and vr["version"] == [1, 1] and vr["flags"] == 0
    assert vr["data"] is True and vr["shape"] == [5] and vr["strides"] == [1]
    assert (vr["code"], vr["bits"], vr["lanes"], vr["device_type"]) == (2, 32, 1, 1)
    assert r["versioned_sum"] == 10.0
    assert r["versioned_name_after"] == "used_dltensor_versioned"
    assert r["versioned_deleted"] == 1
    assert r["readonly_legacy"] == "BufferError" and r["readonly_flags"] == 1
    st = r["stats"]
    assert st["exported"] == st["deleted"] == 9, st
    assert st["live"] == 0 and st["unknown_deletes"] == 0, st


def test_roundtrip_plain(tmp_path):
    cp = run_py(SCRIPT, tmp_path)
    assert cp.returncode == 0, cp.stderr
    assert "Exception ignored" not in cp.stderr, cp.stderr
    check_roundtrip(result_of(cp.stdout))


def test_roundtrip_under_capsan_clean(tmp_path):
    res = run_capsan(SCRIPT, tmp_path, mode="preload", env=PYENV)
    assert res.returncode == 0, res.describe()
    assert "Exception ignored" not in res.stderr, res.stderr
    check_roundtrip(result_of(res.stdout))
    assert res.report is not None, res.describe()
    assert findings(res.report) == [], summarize(res.report)
    p = res.report["processes"][0]
    assert p["summary"]["errors"] == 0 and p["summary"]["warnings"] == 0
    # capsan really watched the process: numpy's own data blocks at least
    assert p["summary"]["events"] > 0, res.describe()
