"""numpy 2, torch 2.13 and JAX as real DLPack peers (cp311 venv): all six
directions through from_dlpack (np<->torch versioned, JAX legacy; JAX's
copy path that releases before it renames, and its shared path), from
several threads at once, round trips keeping and dropping their results.
Correct traffic: exit 0, no finding, and the trace shows capsan saw DLPack
tensors live (so "no finding" cannot come from seeing nothing).
One process for everything (importing JAX is slow)."""
import pytest

from conftest import SCENARIOS, findings, process_of, run_capsan, run_plain, summarize

SCRIPT = SCENARIOS / "clean_peers.py"
ROUNDS = 50
ENV = {"JAX_PLATFORMS": "cpu"}


@pytest.fixture
def cp311():
    from conftest import current_python
    return current_python("cp311")


def assert_clean_peers(res):
    assert res.returncode == 0, res.describe()
    assert "ERROR: capsan:" not in res.stderr and "WARNING: capsan:" not in res.stderr, res.stderr
    out = res.stdout
    assert "stack numpy 2." in out and " torch 2.13" in out and " jax " in out, out
    # both of JAX's import paths were taken: the shared view, and the copy
    # that releases the producer's tensor before renaming its capsule
    for line in ("jax shared True copied True", "directions ok 9",
                 f"round trips ok {2 * ROUNDS}", "threads ok 4", "done"):
        assert line in out, res.describe()
    assert res.report is not None, "no trace file was written\n" + res.describe()
    assert findings(res.report) == [], summarize(res.report)
    p = process_of(res.report)
    assert p["ended"] == "exit" and p["status"] == 0, p
    s = p["summary"]
    assert s["errors"] == s["warnings"] == s["leaked_bytes"] == 0, s
    # >= 900 exchanges, each an export, a consume and a delete
    assert s["events"] >= 3 * 900, s
    # the held views (one per direction, kept across a pause) were live
    # DLPack tensors when a counts record was taken
    points = p.get("counts", {}).get("points", [])
    assert points, "the trace has no counts records"
    assert max(pt[2] for pt in points) >= 6, points


def test_peers_clean(tmp_path, cp311):
    plain = run_plain(SCRIPT, interpreter=cp311, args=[ROUNDS], env=ENV)
    assert plain.returncode == 0, plain.stderr[-3000:]
    res = run_capsan(SCRIPT, tmp_path, interpreter=cp311, args=[ROUNDS], env=ENV)
    assert_clean_peers(res)
    # capsan does not change what the program prints
    assert res.stdout == plain.stdout, (plain.stdout, res.stdout)


def test_peers_full_trace_replays_clean(tmp_path, cp311):
    """record_all=1: every event of the six directions and the threads goes
    to the trace, and the offline replay judges it as clean as the live run
    (the NO_PYTHON releases at shutdown included)."""
    res = run_capsan(SCRIPT, tmp_path, interpreter=cp311, args=[ROUNDS], env=ENV,
                     options=["record_all=1"])
    assert_clean_peers(res)
