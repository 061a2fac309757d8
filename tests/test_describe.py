"""capsan.describe(): fields, producing module, deleter symbol and a verdict
per rule (R13-R22), for numpy and torch objects, raw capsules (unversioned,
versioned, consumed) and the malformed fixture capsules; describing objects
must not leak (clean under capsan) and a raw capsule is never consumed
unless asked."""
import re

from conftest import SCENARIOS, findings, run_capsan, summarize
from test_dlpack_ctypes import PYENV, result_of, run_py

SCRIPT = SCENARIOS / "describe_objects.py"


def verdicts(d: dict) -> dict:
    return {c["rule"]: c["verdict"] for c in d["checks"]}


def check_clean(r: dict):
    t = r["torch"]
    assert t["source"] == "object" and t["object_type"] == "torch.Tensor"
    assert t["capsule"]["name"] == "dltensor" and t["capsule"]["versioned"] is False
    tt = t["tensor"]
    assert (tt["device_type"], tt["device_id"], tt["ndim"]) == (1, 0, 2)
    assert (tt["code"], tt["bits"], tt["lanes"]) == (0, 64, 1)
    assert tt["shape"] == [2, 3] and tt["strides"] == [3, 1] and tt["byte_offset"] == 0
    assert t["elements"] == 6 and t["nbytes"] == 48
    assert t["verdict"] == "ok"
    v = verdicts(t)
    for rule in ("R1", "R3", "R10", "R14", "R15", "R16", "R17", "R18", "R19", "R22"):
        assert v[rule] == "ok", (rule, t["checks"])
    assert v["R13"] == "n/a" and v["R21"] == "n/a" and v["R20"] == "n/a"
    # torch 1.13 has no max_version: describe fell back to the legacy request
    assert t["requested_max_version"] is None
    lines = r["torch_text"].splitlines()
    # capsan hands describe() the producer's own destructor, so the module is named
    assert lines[0].startswith("DLPack capsule 'dltensor' (unversioned) from libtorch_python.so"), lines[0]
    assert re.fullmatch(r"  data 0x[0-9a-f]+  device CPU:0  dtype int64 \(code 0, 64 bits, "
                        r"1 lane\)  ndim 2", lines[1]), lines[1]
    assert lines[2] == "  shape (2, 3)  strides (3, 1) elements  byte_offset 0", lines[2]
    assert lines[3].startswith("  deleter ") and "manager_ctx 0x" in lines[3], lines[3]
    assert "libcapsan" not in lines[3], "the deleter must be torch's, not capsan's wrapper"
    assert lines[4] == "  checks: ok"
    assert r["torch_str_is_text"] is True

    n = r["numpy"]
    assert n["tensor"]["shape"] == [3, 2] and n["tensor"]["strides"] == [4, 2]
    assert n["tensor"]["code"] == 2 and n["verdict"] == "ok"
    assert "strides (4, 2) elements" in r["numpy_text"]
    e = r["numpy_empty"]
    assert e["tensor"]["shape"] == [2, 0] and e["elements"] == 0 and e["verdict"] == "ok"
    z = r["torch_0d"]
    assert z["tensor"]["ndim"] == 0 and z["tensor"]["shape"] == [] and z["verdict"] == "ok"

    # raw capsule: read, not consumed; torch could still consume it afterwards
    assert r["raw"]["source"] == "capsule" and r["raw"]["verdict"] == "ok"
    assert r["raw_name_after"] == "dltensor"
    assert r["raw_consumed_later"] == [0.0, 1.0, 2.0, 3.0]
    u = r["used"]
    assert u["capsule"]["consumed"] is True and u["tensor"] is None
    assert r["used_text"].startswith("DLPack capsule 'used_dltensor' (consumed)")

    vv = r["versioned"]
    assert vv["capsule"]["name"] == "dltensor_versioned" and vv["version"] == [1, 1]
    assert vv["flags"] == 0 and vv["producer"] == "capsan.dlpack"
    assert verdicts(vv)["R13"] == "ok" and verdicts(vv)["R21"] == "ok"
    assert r["versioned_text"].startswith("DLPack capsule 'dltensor_versioned' (version 1.1, "
                                          "flags 0x0) from capsan.dlpack")
    assert r["consume"] == {"name_after": "used_dltensor_versioned", "deleted": ["v1", "v2"],
                            "flag": "ctypes"}
    assert r["torch_consumed_name"] == "used_dltensor"
    ex = r["exporter"]
    assert ex["requested_max_version"] == [1, 3] and ex["version"] == [1, 1]
    assert ex["capsule"]["versioned"] is True and verdicts(ex)["R14"] == "ok"
    assert r["not_dlpack"].startswith("describe() takes a DLPack capsule")
    st = r["stats"]
    assert st["live"] == 0 and st["exported"] == st["deleted"] == 3, st


def test_describe_plain(tmp_path):
    cp = run_py(SCRIPT, tmp_path, "clean")
    assert cp.returncode == 0, cp.stderr
    check_clean(result_of(cp.stdout))


def test_describe_under_capsan_no_leak(tmp_path):
    """600 objects described (their capsules released by their producers'
    destructors), raw capsules read, consumed later or by describe itself:
    no finding."""
    res = run_capsan(SCRIPT, tmp_path, mode="preload", args=["clean"], env=PYENV)
    assert res.returncode == 0, res.describe()
    check_clean(result_of(res.stdout))
    assert res.report is not None, res.describe()
    assert findings(res.report) == [], summarize(res.report)
    p = res.report["processes"][0]
    assert p["summary"]["leaked_bytes"] == 0
    # capsan saw the ~600 exports describe() made and their releases
    assert p["summary"]["events"] >= 600 * 2, p["summary"]


def test_describe_bad_and_symbols(tmp_path):
    cp = run_py(SCRIPT, tmp_path, "bad")
    assert cp.returncode == 0, cp.stderr
    r = result_of(cp.stdout)
    want = {"ndim": ["R15"], "null_shape": ["R15"], "negative_shape": ["R15"],
            "dtype_code": ["R18"], "lanes": ["R18"], "device": ["R19"],
            "unreadable": ["R1"], "unreadable_shape": ["R15"]}
    for kind, rules in want.items():
        b = r["bad_" + kind]
        assert b["verdict"] == "fail" and b["failed"] == rules, (kind, b)
        assert f"{rules[0]} fail:" in b["text"], b["text"]
    # a garbage pointer is named, never followed (that would crash describe)
    assert "does not point to readable memory" in r["bad_unreadable"]["text"]
    assert "does not point to readable memory" in r["bad_unreadable_shape"]["text"]
    assert r["major2"]["verdict"] == "fail" and r["major2"]["R13"]["verdict"] == "fail"
    assert r["major2"]["tensor"] is None  # R13: nothing past deleter/manager_ctx was read
    assert r["flags"]["R21"]["verdict"] == "warn" and "0x20" in r["flags"]["R21"]["message"]
    assert r["offset"]["R17"]["verdict"] == "warn" and "torch" in r["offset"]["R17"]["message"]
    assert r["null_deleter"]["R10"]["verdict"] == "warn"
    assert r["strides_v12"]["verdict"] == "fail"
    assert r["liar"]["verdict"] == "fail"
    assert r["too_new"]["verdict"] == "fail"
    assert r["stats"]["live"] == 0
    # with the runtime stopped, the real producers and deleters are named
    tn = r["torch_nocapsan"]
    assert tn["producer"].startswith("libtorch_python.so"), tn
    assert tn["destructor"]["symbol"] == "DLPack_Capsule_Destructor(_object*)", tn
    assert tn["deleter"]["module"].startswith("libtorch_cpu.so"), tn
    assert r["torch_nocapsan_text"].startswith(
        "DLPack capsule 'dltensor' (unversioned) from libtorch_python.so")
    assert r["numpy_nocapsan"]["producer"].startswith("_multiarray_umath")
    assert r["fixture_nocapsan"]["producer"] == "dlproducer.so"
    assert r["fixture_nocapsan"]["deleter"]["path"].endswith("build/tests/dlproducer.so")
    assert "from capsan.dlpack" in r["python_capsule_text"]
