"""Exchange-API ownership paths that cross into the capsule protocol, into
other threads or through an FFI call (issue 37 paths 1, 2, 6, 7;
rulebook-seams R51, R53). Paths 1, 2, 7 are committed by xkernel.c on a
table's tensors (scenario xapi_paths.py), each with its legal variant
beside it. The tables: torch 2.13's (cp311 venv) and xproducer's Blob (a
fixture's table: the cp313 venv has no torch 2.13, so it is the only
producer there). Path 6 needs tvm-ffi and torch's table: cp311 only
(xffi.c, scenario xffi_calls.py)."""
import subprocess

import pytest

from conftest import SCENARIOS, assert_finding_at, current_python, findings, kinds, run_capsan, summarize

PATHS = SCENARIOS / "xapi_paths.py"

# (python tag, provider): torch's table needs torch 2.13 (cp311 only)
STACKS = [("cp311", "torch"), ("cp311", "blob"), ("cp313", "blob")]


def python_for(tag, provider):
    py = current_python(tag)
    if provider == "torch":
        ok = subprocess.run([str(py), "-c", "import torch, numpy; "
                             "assert torch.__version__.startswith('2.13.0')"],
                            capture_output=True, text=True)
        if ok.returncode != 0:
            pytest.fail(f"the {tag} venv lacks torch 2.13.0 (.ci/venvs): {ok.stderr[-2000:]}")
    return py


def run(tmp_path, mode, tag, provider, options=None, n=None):
    args = [mode, provider] + ([n] if n else [])
    return run_capsan(PATHS, tmp_path, args=args, interpreter=python_for(tag, provider),
                      options=options, timeout=300)


def names(f):
    return [e["event"] for e in f["events"]]


def threads(f):
    return [e.get("thread") for e in f["events"]]


# ---- path 1: an owning exchange tensor lent on in a capsule ----

@pytest.mark.parametrize("tag,provider", STACKS)
def test_lent_on_in_a_capsule_clean(tmp_path, tag, provider):
    """from_py's tensor put in a dltensor_versioned capsule: consumed by
    numpy (and torch), or dropped unconsumed so the capsule's destructor
    deletes it. A new loan, legal every way: nothing to report."""
    res = run(tmp_path, "lend_clean", tag, provider, n=5)
    assert res.returncode == 0 and "ok" in res.stdout, res.describe()
    assert findings(res.report) == [], summarize(res.report)


@pytest.mark.parametrize("tag,provider", STACKS)
def test_lent_on_unchecked_destructor(tmp_path, tag, provider):
    """The same capsule with a destructor that deletes whatever it holds:
    numpy consumed it, so the destructor's delete is the bug; with
    protect=1 the call is skipped and numpy's own delete is the only one."""
    res = run(tmp_path, "lend_unchecked", tag, provider, options=["protect=1"])
    assert res.returncode == 23 and "ok" in res.stdout, res.describe()
    f = assert_finding_at(res, "dlpack-unchecked-destructor", PATHS, "unchecked",
                          event="delete", innermost=False)
    ev = names(f)
    assert ev[0] == "exchange-from-py" and "export" in ev and "consume" in ev, ev
    assert kinds(res.report) == {"dlpack-unchecked-destructor"}, summarize(res.report)


# ---- path 2: a view's memory freed by another thread ----

@pytest.mark.parametrize("tag,provider", STACKS)
def test_view_freed_by_another_thread(tmp_path, tag, provider):
    """A kernel reads a view with the GIL released, holding no reference;
    another thread drops the tensor meanwhile. Reported at the free,
    before the memory goes, naming the view's call and the free's thread
    and line."""
    res = run(tmp_path, "view_thread", tag, provider)
    assert res.returncode == 23 and "ok" in res.stdout, res.describe()
    f = assert_finding_at(res, "dlpack-stale-view", PATHS, "other-frees", event="free",
                          innermost=False)
    assert_finding_at(res, "dlpack-stale-view", PATHS, "unlocked", event="exchange-view",
                      innermost=False)
    assert f["severity"] == "error", f
    view, free = f["events"][0], [e for e in f["events"] if e["event"] == "free"][0]
    assert view["event"] == "exchange-view", names(f)
    assert view.get("thread") != free.get("thread"), f["events"]
    assert kinds(res.report) == {"dlpack-stale-view"}, summarize(res.report)


@pytest.mark.parametrize("tag,provider", STACKS)
def test_view_threads_clean(tmp_path, tag, provider):
    """Another thread drops its reference while the call runs, but the
    caller still holds the tensor; and another thread frees a view's
    tensor after the view's call returned, while the view's thread waits
    in another call: both legal."""
    res = run(tmp_path, "view_thread_clean", tag, provider, n=5)
    assert res.returncode == 0 and "ok" in res.stdout, res.describe()
    assert findings(res.report) == [], summarize(res.report)


# ---- path 7: a view kept past its call ----

@pytest.mark.parametrize("tag,provider", STACKS)
@pytest.mark.parametrize("where", ["static", "heap"])
def test_view_kept_past_its_call(tmp_path, tag, provider, where):
    """A kernel keeps the view in a static (or a heap struct) for later
    calls; the owner dies: the kept DLTensor still describes the freed
    memory. A warning (the later read is not seen), with the view's call,
    the return that left it kept, and the free."""
    mode, sfx = ("kept_view", "") if where == "static" else ("kept_view_heap", "-heap")
    res = run(tmp_path, mode, tag, provider)
    assert res.returncode == 0 and "ok" in res.stdout, res.describe()
    f = assert_finding_at(res, "dlpack-stale-view", PATHS, "owner-dies" + sfx, event="free",
                          innermost=False)
    assert_finding_at(res, "dlpack-stale-view", PATHS, "kept" + sfx, event="exchange-view",
                      innermost=False)
    assert f["severity"] == "warning", f
    assert names(f)[:2] == ["exchange-view", "view-kept"], names(f)
    assert "after its call returned" in f["message"], f["message"]
    assert len(findings(res.report)) == 1, summarize(res.report)


@pytest.mark.parametrize("tag,provider", STACKS)
def test_kept_views_clean(tmp_path, tag, provider):
    """A kept view overwritten, or its heap struct freed, before its owner
    dies; a view on a stack that returned: nothing to report."""
    res = run(tmp_path, "kept_clean", tag, provider, n=5)
    assert res.returncode == 0 and "ok" in res.stdout, res.describe()
    assert findings(res.report) == [], summarize(res.report)


# ---- path 6: an FFI call's error lost around its conversions ----

XFFI = SCENARIOS / "xffi_calls.py"


def test_ffi_error_lost_around_conversions(tmp_path):
    """xffi converts a torch tensor through torch's table and calls a
    tvm-ffi function, which fails with its error raised through the FFI
    error API; the binding's allocator restore overwrites the return code
    and the Python call returns None. dlpack-exchange-contract at that
    call's line (R51 judged at the FFI call), said at the next FFI call."""
    py = python_for("cp311", "torch")
    res = run_capsan(XFFI, tmp_path, args=["lost"], interpreter=py, timeout=300)
    assert res.returncode == 23 and "ok" in res.stdout, res.describe()
    f = assert_finding_at(res, "dlpack-exchange-contract", XFFI, "lost", event="exchange-call",
                          innermost=False)
    assert "TVMFFIFunctionCall" in f["message"] and "without fetching" in f["message"], f["message"]
    assert kinds(res.report) == {"dlpack-exchange-contract"}, summarize(res.report)
    assert len(findings(res.report)) == 1, summarize(res.report)


def test_ffi_errors_fetched_clean(tmp_path):
    """The binding that fetches the error and raises it, and calls that
    succeed through either binding: nothing to report."""
    py = python_for("cp311", "torch")
    res = run_capsan(XFFI, tmp_path, args=["clean"], interpreter=py, timeout=300)
    assert res.returncode == 0 and "ok" in res.stdout, res.describe()
    assert findings(res.report) == [], summarize(res.report)
