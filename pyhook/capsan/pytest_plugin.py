"""pytest plugin: every test (--capsan), or the tests that ask for it (the
`capsan` marker, the `capsan_trace` fixture), runs inside capsan.trace().

    pytest --capsan                         # autoloaded (capsan-0.1.dist-info entry point)
    pytest -p capsan.pytest_plugin --capsan

    @pytest.mark.capsan(allow=["numpy-foreign-free"])   # traced; these kinds do not fail it
    @pytest.mark.capsan(check=False)                      # traced, reported, never failed
    def test_x(capsan_trace): ...                         # the test's Trace (traced, checked)

A traced test:
- setup, call and teardown are one attribution window: every finding the
  runtime reports in it (any kind, any thread) belongs to this test;
- the call runs under capsan's tracing NumPy handler; after teardown (a
  function-scoped fixture may hold the test's arrays until then) and a
  gc.collect(), the blocks the call allocated and still alive are
  numpy-leak findings (not judged when the test itself failed: its
  traceback holds the frames and their arrays), except the ones Python's
  roots still reach (a module global, a cache, a class attribute, a
  session fixture: capsan/reach.py); `@pytest.mark.capsan(roots=False)`
  judges those too;
- findings not allowed make the test fail, with the LeakSanitizer-style
  report and its stacks (pytest's own frames cut off) as the failure text.
The terminal summary lists the tests with findings; --capsan-report=PATH
writes them as JSON.

Loading the plugin does not start the runtime: that happens with --capsan,
or at the first traced test.

Cost. Every event costs what it costs under `capsan run` (the runtime is
the same); on top, a traced test pays only for what its verdict needs:
- every test: a few calls into the runtime (the findings cursor, the
  handler installed and restored) and one count of the NumPy blocks, DLPack
  tensors and Arrow structs still alive whose latest event came in the
  call or later (capsan_scope_live: a walk of the runtime's table and of
  each thread's young objects, no allocation). Zero -- the usual case --
  ends the verdict there: nothing the test made can leak, and no
  collection could change that;
- something still alive: gc.collect(1), the young generations (a test's
  own garbage cycles, such as an exception's traceback and its frames,
  are young), and the count again;
- still alive, and all of it NumPy blocks and DLPack tensors: the roots
  walk (capsan/reach.py) for them, which stops at the last one it finds.
  When it finds them all (a test whose instance or class keeps its
  arrays), they are held and no collection could free them: that is the
  verdict;
- otherwise: the full gc.collect() (tens of ms on a large heap),
  the scope's DLPack and Arrow check (a scan of memory, only when a tensor
  the call consumed or a struct it moved is unreleased), and the roots walk
  for the handler's blocks of this call (the whole heap when one is not
  reachable: a leak). `roots=False` goes this way directly;
- one tracing handler serves test after test as long as nothing but the
  plugin holds it when the next call starts (the runtime tells a call's
  blocks by time). An array of its blocks still alive, or a context that
  captured it (an asyncio task, contextvars.copy_context()), retires it
  and the next call gets a new one: nothing made through an earlier test's
  handler is ever judged as a later test's. (A new handler for every test
  costs about 5% more CPU time on numpy's test_numeric.py: each is another
  handler the runtime knows, and another address every free() of the
  process checks for good.)
bench/plugin_cost.py measures the ratios to a plain run and to `capsan run`.
"""
from __future__ import annotations

import json
import os
import sys

import pytest

_MARKER_HELP = ("capsan(allow=[kinds], check=True, roots=True): trace this test with capsan; "
                "findings whose kind is not in `allow` (exact names, globs like 'numpy-*', or "
                "'leak') fail it; roots=False also judges blocks a module global or cache still holds")

_STATE = pytest.StashKey()
_TEST = pytest.StashKey()


def _capsan():
    import capsan
    if capsan._lib.load_error is not None:
        raise pytest.UsageError(str(capsan._lib.load_error))
    capsan.start()
    return capsan


class _TestState:
    def __init__(self, trace, allow, check, cursor):
        self.trace = trace
        self.allow = allow
        self.check = check
        self.cursor = cursor          # attribution window start (before setup)
        self.handler = None           # the call's tracing handler, until judged
        self.call_ok = False
        self.findings = []            # all of the window's findings


class _SessionState:
    def __init__(self, config):
        self.config = config
        self.enabled = bool(config.getoption("capsan"))
        self.allow = [k for a in config.getoption("capsan_allow") or [] for k in a.split(",") if k]
        self.report_path = config.getoption("capsan_report")
        self.results = []             # (nodeid, findings, allowed kinds, outcome)
        self.outside = []             # findings reported outside every test window
        self.last_end = None
        self.unchecked = []           # tests run after a capsan.stop(): nothing judged


# ---- registration -------------------------------------------------------

def pytest_addoption(parser):
    g = parser.getgroup("capsan", "capsan: DLPack capsule and NumPy data-memory sanitizer")
    g.addoption("--capsan", action="store_true", default=False,
                help="trace every test with capsan; a test with findings fails")
    g.addoption("--capsan-allow", action="append", default=[], metavar="KIND[,KIND]",
                help="finding kinds (globs; 'leak' = every *-leak) that fail no test")
    g.addoption("--capsan-report", default=None, metavar="PATH",
                help="write every traced test's findings to PATH as JSON "
                     "(`capsan report PATH` renders it as text, JSON or HTML)")


@pytest.hookimpl
def pytest_plugin_registered(plugin, manager):
    # The plugin can arrive under two names: "capsan" (the pytest11 entry
    # point) and "capsan.pytest_plugin" (-p). The first one blocks the other,
    # so that both together do not register the module twice.
    if plugin is sys.modules.get(__name__):
        name = manager.get_name(plugin)
        for other in ("capsan", __name__):
            if other != name and manager.get_plugin(other) is None:
                manager.set_blocked(other)


def pytest_configure(config):
    config.addinivalue_line("markers", _MARKER_HELP)
    st = _SessionState(config)
    config.stash[_STATE] = st
    if st.enabled:
        capsan = _capsan()
        st.last_end = capsan.findings_count()


def _session(config):
    return config.stash.get(_STATE, None)


def _wanted(item, st):
    m = item.get_closest_marker("capsan")
    if m is None and not st.enabled and "capsan_trace" not in getattr(item, "fixturenames", ()):
        return None
    allow = list(st.allow)
    check, roots = True, True
    if m is not None:
        allow += list(m.kwargs.get("allow", ()) or ())
        if m.args:
            allow += list(m.args[0] if isinstance(m.args[0], (list, tuple)) else m.args)
        check = bool(m.kwargs.get("check", True))
        roots = bool(m.kwargs.get("roots", True))
    return allow, check, roots


def _note_outside(st, capsan):
    if not st.enabled or st.last_end is None or capsan.findings_count() <= st.last_end:
        return
    st.outside += capsan.findings(st.last_end)


class _Handler:
    """The tracing handler the traced tests' calls share. A call's blocks
    are the ones allocated through it during its window (the runtime
    filters by time), so one handler can serve one test after another, as
    long as nothing but this holds it when the next call starts: an array
    made through it (a held or leaked block) or a context that captured it
    (an asyncio task, contextvars.copy_context()) could allocate through it
    later, and a new handler keeps what they make out of later verdicts.
    Each new handler stays known to the runtime while it lives, and its
    address in the filter every free() reads for good."""

    def __init__(self):
        self.h = None
        self.inner = None
        self.alone = 0  # sys.getrefcount(self.h) when only this holds it

    def take(self):
        """The handler for a call, wrapping numpy's current handler; None
        without numpy (Trace then installs none)."""
        from . import _lib
        from .tracing import _numpy_available
        if not _numpy_available():
            return None
        cur = _lib.get_handler()
        if self.h is not None and cur is self.inner and sys.getrefcount(self.h) == self.alone:
            return self.h
        self.h = _lib.handler_new(cur)
        self.inner = cur
        self.alone = sys.getrefcount(self.h)
        return self.h


_HANDLER = pytest.StashKey()


# ---- the per-test window ---------------------------------------------------

@pytest.hookimpl(tryfirst=True)
def pytest_runtest_protocol(item, nextitem):
    """A traced test runs setup, call and teardown without logging them, so
    that its leaks can be judged after teardown (a function-scoped fixture
    may hold the test's arrays until then) and still fail the call report."""
    st = _session(item.config)
    want = _wanted(item, st) if st else None
    if want is None:
        return None
    from _pytest.runner import runtestprotocol
    capsan = _capsan()
    if capsan._lib.stopped():
        # an earlier test called capsan.stop(): nothing can be judged now
        st.unchecked.append(item.nodeid)
        return None
    _note_outside(st, capsan)
    allow, check, roots = want
    ts = _TestState(capsan.Trace(allow=allow, check=False, roots=roots), allow, check,
                    capsan.findings_count())
    item.stash[_TEST] = ts
    ihook = item.ihook
    ihook.pytest_runtest_logstart(nodeid=item.nodeid, location=item.location)
    try:
        reports = runtestprotocol(item, nextitem=nextitem, log=False)
        _judge(item, ts, reports)
        for rep in reports:
            ihook.pytest_runtest_logreport(report=rep)
    finally:
        st.last_end = capsan.findings_count()
        item.stash[_TEST] = None
    ihook.pytest_runtest_logfinish(nodeid=item.nodeid, location=item.location)
    return True


@pytest.hookimpl(hookwrapper=True, tryfirst=True)
def pytest_runtest_call(item):
    ts = item.stash.get(_TEST, None)
    if ts is None:
        yield
        return
    handler = item.config.stash.setdefault(_HANDLER, _Handler())
    ts.trace._open(handler.take())
    try:
        outcome = yield
    finally:
        ts.handler, _ = ts.trace._restore()
    ts.call_ok = outcome.excinfo is None


def _judge(item, ts, reports):
    """After teardown: leaks (unless the test failed: its traceback keeps
    its frames and their arrays alive), then every finding of the window."""
    st = _session(item.config)
    call = next((r for r in reports if r.when == "call"), None)
    if ts.handler is not None and ts.call_ok and call is not None and call.passed:
        ts.trace._judge(ts.handler)
    ts.handler = None
    ts.trace._collect(ts.cursor)
    ts.findings = list(ts.trace._findings)
    st.results.append((item.nodeid, ts.findings, ts.allow, ts))
    bad = ts.trace.unexpected(ts.allow)
    if not bad:
        return
    r = _CapsanRepr(bad, f"in {item.name} (setup, call and teardown)")
    if ts.check and call is not None and call.passed and not hasattr(call, "wasxfail"):
        call.outcome = "failed"
        call.longrepr = r
        return
    target = call if call is not None else reports[0]
    target.sections.append(("capsan findings", r.text))


@pytest.fixture
def capsan_trace(request):
    """The capsan.Trace of this test (open during the test's call)."""
    ts = request.node.stash.get(_TEST, None)
    if ts is None:
        pytest.fail("capsan_trace: this test is not traced by capsan", pytrace=False)
    return ts.trace


_HARNESS = (os.sep + "_pytest" + os.sep, os.sep + "pluggy" + os.sep)


def _harness_frame(fr) -> bool:
    """pytest's and pluggy's own frames: below the test, never the cause."""
    return fr.python and any(h in fr.file for h in _HARNESS)


class _CapsanRepr:
    """The failure text of a test with findings (a TerminalRepr for pytest)."""

    def __init__(self, findings, where):
        from .finding import render_text
        self.text = (f"capsan: {len(findings)} finding(s) {where}\n\n"
                     + render_text(findings, cut=_harness_frame))
        kinds = {}
        for f in findings:
            kinds.setdefault(f.kind, f.at)
        msg = "capsan: " + ", ".join(k + (f" at {at}" if at else "") for k, at in kinds.items())
        self.reprcrash = _Crash(msg)

    def toterminal(self, tw):
        for line in self.text.rstrip("\n").split("\n"):
            tw.line(line, red=line.startswith("==") and "ERROR" in line)

    def __str__(self):
        return self.text


class _Crash:
    def __init__(self, message):
        self.message = message
        self.path = ""
        self.lineno = 0

    def __str__(self):
        return self.message


# ---- end of session ---------------------------------------------------------

def pytest_sessionfinish(session):
    st = _session(session.config)
    if st is None:
        return
    if st.enabled and "capsan" in sys.modules:
        _note_outside(st, sys.modules["capsan"])
        st.last_end = sys.modules["capsan"].findings_count()
    if st.report_path and (st.enabled or st.results):
        from .finding import matches
        tests = [{"nodeid": nid, "allow": allow,
                  "findings": [dict(f.raw, allowed=matches(f.kind, allow)) for f in fs]}
                 for nid, fs, allow, _ in st.results]
        # `capsan report PATH` renders it as it renders a trace (text, JSON, HTML)
        data = {"tool": "capsan", "format": 1, "pid": os.getpid(), "ppid": os.getppid(),
                "argv": [sys.executable, "-m", "pytest", *sys.argv[1:]], "exe": sys.executable,
                "status": int(session.exitstatus), "tests": tests,
                "outside_tests": [f.raw for f in st.outside]}
        with open(st.report_path, "w") as fh:
            json.dump(data, fh, indent=1)


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    st = _session(config)
    if st is None:
        return
    from .finding import matches, summary_line
    with_findings = [(nid, fs, allow) for nid, fs, allow, _ in st.results if fs]
    if st.unchecked:
        terminalreporter.write_sep("=", f"capsan: {len(st.unchecked)} test(s) not checked: "
                                        f"capsan.stop() was called before them", yellow=True)
        for nid in st.unchecked[:10]:
            terminalreporter.write_line(nid)
        if len(st.unchecked) > 10:
            terminalreporter.write_line(f"... and {len(st.unchecked) - 10} more")
    if not with_findings and not st.outside:
        if st.results:
            terminalreporter.write_sep("=", f"capsan: {len(st.results)} traced test(s), no findings",
                                       green=True)
        return
    tr = terminalreporter
    tr.write_sep("=", f"capsan: {len(with_findings)} test(s) with findings", red=True)
    everything = []
    for nid, fs, allow in with_findings:
        everything += fs
        counts = {}
        for f in fs:
            counts.setdefault(f.kind, []).append(f)
        parts = []
        for kind, group in counts.items():
            at = next((f.at for f in group if f.at), None)
            tag = " (allowed)" if matches(kind, allow) else ""
            parts.append(f"{kind} x{len(group)}" + (f" at {at}" if at else "") + tag)
        tr.write_line(f"{nid}: " + "; ".join(parts))
    if st.outside:
        everything += st.outside
        kinds = sorted({f.kind for f in st.outside})
        tr.write_line(f"(outside any test): {len(st.outside)} finding(s): {', '.join(kinds)}")
    tr.write_line(summary_line(everything))
    if st.report_path:
        tr.write_line(f"capsan: JSON report written to {st.report_path}")
