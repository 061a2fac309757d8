"""Versioned DLPack (>= 1.0) from real producers on the current stack
(cp311: numpy 2 and torch 2.13): every finding kind that applies to a
DLManagedTensorVersioned, committed by the fixture consumer's versioned
paths on numpy's and torch's own versioned capsules, with the kind, the
object type and the script line of the events that matter; what a real
producer cannot show (an unchecked destructor, byte_offset != 0) is
checked the other way round: their destructors leave consumed capsules
alone, and torch 2.13 honors byte_offset; and capsan.describe() shows the
version and flags of their capsules.

Debian's numpy 1.24 and torch 1.13 speak only unversioned DLPack: these
run on the cp311 venv (`make venvs fixtures-current`) and skip without it.
"""
import pytest

from conftest import (BUILD, DEFAULT_EXITCODE, SCENARIOS, assert_finding_at, events_at,
                      findings, fixdir_for, kinds, marker_line, process_of, run_capsan, summarize)
from test_dlpack_ctypes import result_of

S = SCENARIOS
SCRIPT = S / "dlv_real.py"


@pytest.fixture
def cp311():
    from conftest import current_python
    return current_python("cp311")


def run_real(tmp_path, py, bug, producer, options=()):
    return run_capsan(SCRIPT, tmp_path, interpreter=py, args=[bug, producer],
                      options=list(options))


def at(res, kind, tag, event, producer):
    """kind's finding with `event` at the line tagged `tag`. torch's
    __dlpack__ is Python (torch/_tensor.py): its export's innermost Python
    frame is torch's, the script line is further out."""
    innermost = not (producer == "torch" and event == "export")
    return assert_finding_at(res, kind, SCRIPT, tag, event=event, innermost=innermost)


def versioned_object(f):
    assert f["object"]["type"] == "DLManagedTensorVersioned", f["object"]


def error_exit(res):
    assert res.returncode == DEFAULT_EXITCODE, res.describe()


PRODUCERS = ["numpy", "torch"]


# ---------------------------------------------------------------- dlpack-leak

@pytest.mark.parametrize("producer", PRODUCERS)
def test_versioned_leak(tmp_path, cp311, producer):
    """Consumed (renamed used_dltensor_versioned), deleter never called.
    For numpy: the versioned leak is reported on numpy 2 with torch 2.13
    installed and imported in the same process."""
    res = run_real(tmp_path, cp311, "leak", producer)
    error_exit(res)
    assert "sum 28.0" in res.stdout and "survived 28.0" in res.stdout, res.describe()
    f = at(res, "dlpack-leak", "consume-leak", "consume", producer)
    at(res, "dlpack-leak", "export", "export", producer)
    versioned_object(f)
    assert f["bytes"] == 32, f
    assert "consumed but its deleter was never called" in f["message"], f["message"]
    assert len(findings(res.report, "dlpack-leak")) == 1, summarize(res.report)
    # the array numpy exported stays referenced by the leaked tensor: its
    # data is never freed either, the indirect part of the one finding
    assert kinds(res.report) == {"dlpack-leak"}, summarize(res.report)
    if producer == "numpy":
        assert f["indirect_bytes"] == 32 and f["indirect"][0]["kind"] == "numpy-leak", f
    assert "stack numpy 2." in res.stdout and " torch 2.13" in res.stdout, res.stdout


# ---------------------------------------------------------------- dlpack-double-delete

@pytest.mark.parametrize("producer", PRODUCERS)
def test_versioned_double_delete(tmp_path, cp311, producer):
    res = run_real(tmp_path, cp311, "double", producer, options=["protect=1"])
    error_exit(res)
    # protect=1 skipped the second call into numpy's / torch's deleter
    assert "sum 28.0" in res.stdout and "survived 28.0" in res.stdout, res.describe()
    f = at(res, "dlpack-double-delete", "double-delete", "delete", producer)
    at(res, "dlpack-double-delete", "export", "export", producer)
    versioned_object(f)
    dels = [e for e in f["events"] if e["event"] == "delete"]
    assert len(dels) == 2, f["events"]
    assert kinds(res.report) == {"dlpack-double-delete"}, summarize(res.report)


# ---------------------------------------------------------------- dlpack-not-renamed

@pytest.mark.parametrize("producer", PRODUCERS)
def test_versioned_not_renamed(tmp_path, cp311, producer):
    """The consumer releases and leaves "dltensor_versioned": numpy's and
    torch's (correct) destructors then release again when the capsule dies.
    Reported before that second call runs (protect=1 skips it)."""
    res = run_real(tmp_path, cp311, "not_renamed", producer, options=["protect=1"])
    error_exit(res)
    assert "survived 28.0" in res.stdout, res.describe()
    f = at(res, "dlpack-not-renamed", "delete-no-rename", "delete", producer)
    versioned_object(f)
    # the second delete is the producer's destructor's, at the capsule's death
    dtor = events_at(f, SCRIPT, marker_line(SCRIPT, "destroy"), "delete")
    assert dtor, f["events"]
    assert len(findings(res.report)) == 1, summarize(res.report)
    assert "dlpack-not-renamed" in res.stderr


# ---------------------------------------------------------------- dlpack-reconsume

@pytest.mark.parametrize("producer", PRODUCERS)
def test_versioned_reconsume(tmp_path, cp311, producer):
    res = run_real(tmp_path, cp311, "reconsume", producer)
    error_exit(res)
    assert "sums 28.0 True" in res.stdout, res.describe()
    f = at(res, "dlpack-reconsume", "reconsume", "reconsume", producer)
    versioned_object(f)
    assert kinds(res.report) == {"dlpack-reconsume"}, summarize(res.report)


# ---------------------------------------------------------------- dlpack-bad-tensor

@pytest.mark.parametrize("producer", PRODUCERS)
def test_versioned_bad_tensor_shape_written(tmp_path, cp311, producer):
    """R20: the consumer writes into the producer's shape array. With torch
    the damage is real: the exported shape is torch's own tensor's sizes,
    so the producer's tensor shrinks."""
    res = run_real(tmp_path, cp311, "reshape", producer)
    error_exit(res)
    assert "sum 28.0" in res.stdout, res.describe()
    f = at(res, "dlpack-bad-tensor", "reshape", "check", producer)
    versioned_object(f)
    assert "changed while the tensor was on loan (R20)" in f["message"], f["message"]
    assert kinds(res.report) == {"dlpack-bad-tensor"}, summarize(res.report)


# ---------------------------------------------------------------- unchecked destructor

@pytest.mark.parametrize("producer", PRODUCERS)
def test_versioned_destructors_are_checked(tmp_path, cp311, producer):
    """dlpack-unchecked-destructor needs a producer whose destructor ignores
    the used_* name; numpy 2's and torch 2.13's check it. A correctly
    consumed capsule dropped afterwards is released exactly once: nothing
    to report, and capsan saw the exchange."""
    res = run_real(tmp_path, cp311, "checked", producer)
    assert res.returncode == 0, res.describe()
    assert "sum 28.0" in res.stdout and "survived 28.0" in res.stdout, res.describe()
    assert findings(res.report) == [], summarize(res.report)
    assert process_of(res.report)["summary"]["events"] >= 3, res.describe()


# ---------------------------------------------------------------- byte offset

def test_versioned_byte_offset_honored_by_torch2(tmp_path, cp311):
    """torch 2.13 (like numpy 2) reads from data + byte_offset: a versioned
    capsule with byte_offset 16 is no dlpack-byte-offset-ignored there
    (capsan keeps reporting it for torch 1.13, test_dlpack_findings.py)."""
    script = S / "dlv_offset.py"
    res = run_capsan(script, tmp_path, interpreter=cp311)
    assert res.returncode == 0, res.describe()
    want = "[0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0]"
    for what in ("torch capsule", "torch object", "numpy object"):
        assert f"{what} {want}" in res.stdout, res.describe()
    assert "torch 2.13" in res.stdout and "deleted 3" in res.stdout, res.stdout
    assert findings(res.report) == [], summarize(res.report)
    assert process_of(res.report)["summary"]["events"] >= 3 * 3, res.describe()


# ---------------------------------------------------------------- describe()

def test_describe_versioned_exports(tmp_path, cp311):
    """describe() shows version and flags of numpy 2 / torch 2.13 capsules:
    READ_ONLY for a read-only array, IS_COPIED for copy=True (held to it:
    R24), numpy's owner capsule of an array imported from torch; under
    capsan, with nothing to report."""
    env = {"PYTHONPATH": f"{BUILD / 'python'}:{fixdir_for(cp311)}", "JAX_PLATFORMS": "cpu"}
    res = run_capsan(S / "describe_versioned.py", tmp_path, interpreter=cp311, mode="preload",
                     env=env, timeout=180)
    assert res.returncode == 0, res.describe()
    r = result_of(res.stdout)
    assert r["versions"]["numpy"].startswith("2.") and r["versions"]["torch"].startswith("2.13")

    for key in ("numpy_readonly", "numpy_readonly_capsule"):
        d = r[key]
        assert d["name"] == "dltensor_versioned" and d["versioned"] is True, d
        assert d["version"][0] == 1 and d["flags"] == 1 and d["flag_names"] == ["READ_ONLY"], d
        assert d["checks"]["R13"] == "ok" and d["checks"]["R21"] == "ok", d
        assert d["text"].startswith(f"DLPack capsule 'dltensor_versioned' (version "
                                    f"{d['version'][0]}.{d['version'][1]}, flags 0x1 READ_ONLY)"), d
        assert d["shape"] == [2, 3] and d["verdict"] == "ok", d
    assert r["numpy_readonly_legacy"] == "BufferError"  # R21: no legacy export of read-only data

    p = r["numpy_plain"]
    assert p["flags"] == 0 and p["flag_names"] == [] and "flags 0x0)" in p["text"], p
    c = r["numpy_copy"]
    assert c["flag_names"] == ["IS_COPIED"] and c["checks"]["R24"] == "ok", c
    assert "flags 0x2 IS_COPIED" in c["text"] and "copy=True" in c["text"], c["text"]
    n = r["numpy_nocopy"]
    assert n["flags"] == 0 and n["checks"]["R24"] == "ok", n
    lg = r["numpy_legacy"]
    assert lg["name"] == "dltensor" and lg["version"] is None and "(unversioned)" in lg["text"]

    t = r["torch"]
    assert t["name"] == "dltensor_versioned" and t["version"][0] == 1 and t["flags"] == 0, t
    assert t["producer"].startswith("libtorch") and t["verdict"] == "ok", t
    assert t["shape"] == [3, 2]
    assert r["torch_capsule"]["version"] == t["version"]
    # copy=True: whatever torch says, describe holds the flags to the request
    tc = r["torch_copy"]
    assert (tc["checks"]["R24"] == "ok") == ("IS_COPIED" in tc["flag_names"]), tc
    if tc["checks"]["R24"] == "fail":
        assert "without IS_COPIED" in tc["text"], tc["text"]

    o = r["owner"]
    assert o["name"] == "numpy_dltensor_versioned" and o["version"] == t["version"], o
    assert o["producer"].startswith("libtorch") and o["verdict"] == "ok", o
    assert "held by _multiarray_umath" in o["text"], o["text"]

    j = r["jax"]  # JAX answers max_version with a legacy capsule
    assert j["name"] == "dltensor" and j["version"] is None and j["verdict"] == "ok", j

    assert res.report is not None, res.describe()
    assert findings(res.report) == [], summarize(res.report)
    assert process_of(res.report)["summary"]["events"] >= 10 * 2, res.describe()
