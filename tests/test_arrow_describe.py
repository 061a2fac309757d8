"""capsan.describe() of the Arrow PyCapsule interface: format, length,
children, release state and the producing library, read without consuming
(nothing leaks, nothing is reported)."""
import json

from conftest import SCENARIOS, findings, run_capsan


def test_describe_arrow(tmp_path, interp):
    res = run_capsan(SCENARIOS / "describe_arrow.py", tmp_path, interpreter=interp,
                     env={"PYTHONPATH": f"{SCENARIOS.parent.parent / 'build' / 'python'}:"
                                        f"{SCENARIOS.parent.parent / 'build' / 'tests'}"})
    ds = [json.loads(line) for line in res.stdout.splitlines() if line.startswith("{")]
    assert len(ds) == 3, res.describe()
    frame, stream, empty = ds
    assert [c["name"] for c in frame["capsules"]] == ["arrow_schema", "arrow_array"]
    sch, arr = frame["capsules"]
    assert sch["struct"]["format"] == "l" and sch["struct"]["name"] == "x"
    assert arr["struct"]["length"] == 5 and arr["struct"]["n_buffers"] == 2
    assert arr["released"] is False and arr["producer"].endswith("arrowfx.so"), arr
    assert frame["verdict"] == "ok"
    assert stream["source"] == "capsule" and stream["capsules"][0]["struct"]["callbacks"] == {
        "get_schema": True, "get_next": True, "get_last_error": True}
    assert empty["verdict"] == "fail" and empty["capsules"][1]["released"] is True
    assert "Arrow capsule 'arrow_array' from" in res.stderr and "length 5" in res.stderr
    # an inspection consumes nothing: the capsules' destructors released everything
    assert findings(res.report) == [], res.describe()
