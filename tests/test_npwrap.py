"""Where foreign memory was wrapped (issue 11, item 4): numpy-foreign-free
and numpy-double-free name the line where an extension made an array around
the memory numpy later free()s, through numpy's C-API table (PyArray_New,
PyArray_NewFromDescr with data), also when the freed pointer lies inside
the wrapped memory rather than at its start."""
import signal

from conftest import (SCENARIOS, assert_finding_at, findings, is_signal, kinds, process_of,
                      run_capsan, run_plain, summarize)

S = SCENARIOS / "np_frame_detach.py"


def test_interior_free_names_the_wrap(tmp_path, anypy):
    native = run_plain(S, args=["detach"], interpreter=anypy)
    assert is_signal(native.returncode, signal.SIGABRT) and "survived" not in native.stdout, (
        "the fixture must really free a pointer malloc never returned", native.returncode,
        native.stderr[-2000:])
    res = run_capsan(S, tmp_path, args=["detach"], interpreter=anypy)
    assert is_signal(res.returncode, signal.SIGABRT), res.describe()
    err = res.stderr
    assert "numpy-foreign-free" in err and "array made around the memory this pointer lies in" \
        in err, res.describe()
    f = assert_finding_at(res, "numpy-foreign-free", S, "pool", event="wrap", innermost=False)
    assert_finding_at(res, "numpy-foreign-free", S, "free", event="free", innermost=False)
    wrap = [e for e in f["events"] if e["event"] == "wrap"]
    assert len(wrap) == 1 and wrap[0]["phrase"] == \
        "array made around the memory this pointer lies in at", f["events"]
    assert [e["event"] for e in f["events"]] == ["wrap", "free"], f["events"]
    assert kinds(res.report) == {"numpy-foreign-free"}, summarize(res.report)
    assert process_of(res.report)["ended"] == "signal", summarize(res.report)


def test_copy_is_clean(tmp_path, anypy):
    res = run_capsan(S, tmp_path, args=["copy"], interpreter=anypy)
    assert res.returncode == 0 and "pools freed 1" in res.stdout, res.describe()
    assert findings(res.report) == [], summarize(res.report)


def test_exact_wrap_named(tmp_path, anypy):
    """OWNDATA on a whole malloc'd block (np_foreign.exact): the wrap is at
    the array's own data pointer."""
    script = SCENARIOS / "np_owndata.py"
    res = run_capsan(script, tmp_path, args=["exact"], interpreter=anypy)
    assert "survived exact" in res.stdout, res.describe()
    f = assert_finding_at(res, "numpy-foreign-free", script, "create-exact", event="wrap",
                          innermost=False)
    phrases = [e["phrase"] for e in f["events"]]
    assert phrases == ["array made around this memory at",
                       "freed with libc free() by numpy at"], phrases


def test_wrap_without_free_is_nothing(tmp_path, anypy):
    """Arrays around foreign memory are never findings by themselves: many
    wraps (more than the cache holds) through both constructors, each freed
    by its capsule base, and torch's tensor.numpy() where torch is there."""
    code = (
        "import framegrab, np_foreign as O\n"
        "for i in range(6000):\n"
        "    p = framegrab.frames(1, 2, 3)\n"
        "    a = O.capsule_base(3)\n"
        "    assert p.sum() >= 0 and a.sum() == 3.0\n"
        "    del p, a\n"
        "assert framegrab.pools() == 6000 and O.freed() == 6000\n"
        "try:\n"
        "    import torch\n"
        "except ImportError:\n"
        "    torch = None\n"
        "if torch is not None:\n"
        "    t = torch.arange(10.0)\n"
        "    for i in range(100):\n"
        "        assert t.numpy().sum() == 45.0\n"
        "print('done', flush=True)\n")
    res = run_capsan(code, tmp_path, interpreter=anypy)
    assert res.returncode == 0 and "done" in res.stdout, res.describe()
    assert findings(res.report) == [], summarize(res.report)
