"""Native stacks: the chain cache behind fast_unwind=1 (the default) reuses
a native chain only when every return address on the stack still matches
it, so it must give exactly the stacks libunwind gives every time."""
from collections import Counter

import pytest

from conftest import ALL_PYTHONS, CURRENT, SCENARIOS, current_python, findings, run_capsan

S = SCENARIOS / "stack_chains.py"


def stacks(report):
    """Every event's stack as module+offset / function (native) and
    file:line (Python) tuples, counted."""
    out = Counter()
    for f in findings(report):
        for ev in f["events"]:
            key = []
            for fr in ev["stack"]:
                if fr.get("python"):
                    key.append((fr["file"], fr["line"]))
                else:
                    key.append((fr.get("module"), fr.get("offset"), fr.get("function")))
            out[(f["kind"], ev["event"], tuple(key))] += 1
    return out


@pytest.mark.parametrize("tag", sorted(ALL_PYTHONS))
def test_fast_unwind_gives_libunwinds_stacks(tmp_path, tag):
    """On every interpreter: a chain hit's Python frames are proven from
    the frames as each CPython lays them out (code object, instruction,
    entry frame), the memo of two stacks a chain keeps is replaced as
    stacks come and go, and every stack is still the one a walk gives."""
    py = current_python(tag) if tag in CURRENT else ALL_PYTHONS[tag]
    fast = run_capsan(S, tmp_path / "fast", options=["fast_unwind=1"], interpreter=py)
    slow = run_capsan(S, tmp_path / "slow", options=["fast_unwind=0"], interpreter=py)
    for r in (fast, slow):
        assert "done" in r.stdout, r.describe()
        assert r.returncode == 23, r.describe()
    a, b = stacks(fast.report), stacks(slow.report)
    # 3 kept arrays a round and one consumed capsule, 40 rounds
    assert sum(n for (k, *_), n in a.items() if k == "numpy-leak") >= 120, a
    assert sum(n for (k, *_), n in a.items() if k == "dlpack-leak") >= 40, a
    native = [fr for key in a for fr in key[2] if isinstance(fr[0], str) or fr[0] is None]
    assert any(fr[0] and "dlconsumer" in fr[0] for fr in native), "no native frames seen"
    assert a == b, "stacks differ:\n" + "\n".join(
        f"{'fast' if k in a else 'slow'} {k}" for k in (set(a) ^ set(b)))


def test_fast_unwind_with_chains_deeper_than_native_depth(tmp_path):
    """native_depth=3: every chain from a hook to the eval loop is longer
    than the frames a stack keeps (as deep C++ and Rust paths are with the
    default 16), so the cache keeps and proves only the frames up to the
    third foreign one. The stacks must still be libunwind's, cut the same
    way, and the cache must be used (a chain per call path, not a walk per
    event: the events far outnumber the paths)."""
    opts = ["native_depth=3"]
    fast = run_capsan(S, tmp_path / "fast", options=["fast_unwind=1", *opts])
    slow = run_capsan(S, tmp_path / "slow", options=["fast_unwind=0", *opts])
    for r in (fast, slow):
        assert "done" in r.stdout, r.describe()
        assert r.returncode == 23, r.describe()
    a, b = stacks(fast.report), stacks(slow.report)
    assert sum(n for (k, *_), n in a.items() if k == "numpy-leak") >= 120, a
    for key in a:
        # one address may be several frames (functions inlined into it)
        addrs = {fr[:2] for fr in key[2] if len(fr) == 3}
        assert len(addrs) <= 3, key
    assert a == b, "stacks differ:\n" + "\n".join(
        f"{'fast' if k in a else 'slow'} {k}" for k in (set(a) ^ set(b)))
