"""capsan.trace(): a scope whose NumPy allocations go through a fresh
tracing handler, and whose findings (of every kind) are collected."""
from __future__ import annotations

import functools
import gc
import inspect
import json
import os
import sys
import threading

from . import _lib, exchange
from .finding import matches, parse, render_text

__all__ = ["Trace", "trace"]


def _numpy_available() -> bool:
    """Without numpy there is no handler to install (DLPack findings are
    still collected)."""
    if "numpy" in sys.modules:
        return True
    try:
        import numpy  # noqa: F401
    except ImportError:
        return False
    return True


def _left_alive(since) -> bool:
    """Whether a NumPy block, DLPack tensor or Arrow struct that the scope
    begun at `since` made or touched is still alive, after the cheap
    collection of the young generations if need be (most of a scope's
    garbage cycles are young: an exception's traceback and its frames).
    Only then can gc.collect() and the verdicts find anything: a full
    collection costs about the heap's size (tens of ms under pytest)."""
    if not _lib.scope_live(since):
        return False
    gc.collect(1)
    return bool(_lib.scope_live(since))


def _only_keyed(since) -> bool:
    """Whether all the scope left alive is NumPy blocks and DLPack tensors
    (no Arrow struct): only then can _all_held settle the verdict. Counted,
    with no list of their addresses made on this side."""
    return (_lib.has("capsan_scope_live_keys") and
            _lib.scope_live_key_count(since) == _lib.scope_live(since))


def _all_held(since, skip_frames) -> bool:
    """Whether Python's roots reach everything the scope left alive (all of
    it NumPy blocks and DLPack tensors: _only_keyed): no collection can free
    what they reach, and what they reach is held, not leaked, so the verdict
    is known without the full collection (a test whose instance or class
    keeps its arrays). The walk stops at the last one it finds."""
    keys = _lib.scope_live_keys(since)
    if not keys or len(keys) != _lib.scope_live(since):
        return False  # a change meanwhile: the full way
    from .reach import reached_blocks
    return len(reached_blocks(keys, skip_frames)) == len(keys)


class Trace:
    """What `capsan.trace()` returns: a context manager and a decorator.

    On entry a new tracing `mem_handler` (wrapping numpy's current handler,
    or `inner`) is installed with PyDataMem_SetHandler for the current
    context (this thread, this asyncio task; tasks created inside inherit
    it, threads started inside do not, unless the interpreter starts them
    in a copy of the starter's context, as 3.14+'s free-threaded builds do
    (sys.flags.thread_inherit_context): under `capsan run` those are
    tracked globally). On exit -- also when an exception escapes -- the previous
    handler is restored, `gc.collect()` runs (only when something the
    scope made or touched is still alive: otherwise there is nothing to
    judge), the blocks allocated through the tracing handler and still
    alive become `numpy-leak` findings, and
    every finding the runtime reported while the scope was open (any kind,
    any thread: DLPack findings too) is collected into `findings`.

    A block still referenced when the scope ends is a leak: keep the work
    in a function, or `del` what must not outlive the scope. With
    `roots=True` (the pytest plugin's way), a block that Python's roots
    still reach is held instead: a loaded module's globals, a cache or a
    class attribute reachable from one, a local of a running frame other
    than the one holding the `with` (capsan/reach.py), as LeakSanitizer's
    root set decides; only a block nothing in Python accounts for (a
    reference a C extension took and lost) is then a leak. When the scope
    is left by an exception, leaks are not judged (the traceback keeps the
    frames, and their arrays, alive); the other findings are collected.

    As a decorator (`@capsan.trace()`), each call is one scope; findings
    accumulate in the Trace and, unless `check=False`, a call with findings
    not in `allow` raises AssertionError (`assert_clean`). Used with
    `with`, the scope only collects, unless `check=True`.
    """

    def __init__(self, inner=None, *, allow=(), check=None, leaks=True, roots=False):
        self.inner = inner
        self.roots = roots
        self.allow = list(allow or ())
        self.check = check
        self.leaks = leaks
        self._findings = []
        self._seen = set()         # absolute finding numbers already collected
        self._scopes = []          # (handler, previous handler, cursor, start ns), innermost last
        self._lock = threading.Lock()
        self.handler = None        # the tracing handler of the innermost open scope

    # ---- scope ----
    def __enter__(self):
        self._open()
        return self

    def __exit__(self, et, ev, tb):
        h, cursor = None, None
        try:
            h, cursor = self._restore()
        finally:
            # leaks are judged only on a normal exit (see the class docstring)
            if et is None:
                self._judge(h, skip_frames=(sys._getframe(1),))
            if cursor is not None:
                self._collect(cursor)
        if et is None and self.check:
            self.assert_clean()
        return False

    def _open(self, handler=None):
        """Install a fresh tracing handler for the current context (or
        `handler`, one from _lib.handler_new that served earlier scopes:
        only the blocks it allocates from now on are this scope's)."""
        # idempotent; the pytest plugin imports capsan without starting it
        if not exchange.start() and _lib.stopped():
            raise RuntimeError("capsan.trace(): capsan was stopped (capsan.stop()) and does not "
                               "start again in this process; this scope could judge nothing")
        cursor = _lib.findings_count()
        since = _lib.now_ns() if _lib.has("capsan_now_ns") else 0
        h = prev = None
        if _numpy_available():
            h = handler if handler is not None else _lib.handler_new(self.inner)
            prev = _lib.set_handler(h)
        with self._lock:
            self._scopes.append((h, prev, cursor, since))
            self.handler = h

    def _restore(self):
        """Close the innermost scope: the previous handler is back. Returns
        (tracing handler, cursor at entry); leaks are not judged yet."""
        with self._lock:
            h, prev, cursor, since = self._scopes.pop()
            self.handler = self._scopes[-1][0] if self._scopes else None
        if h is not None:
            _lib.set_handler(prev)
        self._since = since
        return h, cursor

    def _judge(self, h, skip_frames=()):
        """gc.collect(), then every block `h` allocated in the scope and
        still alive is a numpy-leak (only while the runtime records: after
        capsan.stop() frees are no longer seen), unless `roots` and Python's
        roots reach it (skip_frames are no roots). When nothing the scope
        made or touched is alive any more, nothing can be judged: the
        collection and the rest are skipped."""
        if not (self.leaks and _lib.active()):
            return
        since = getattr(self, "_since", None)
        if since and _lib.has("capsan_scope_live"):
            if not _left_alive(since):
                return
            # the roots walk may settle it without the collection; with an
            # Arrow struct alive, the scan after it below is the only one
            if self.roots and _only_keyed(since):
                # the tensors first, before any list of the scope's keys
                # was made in this process: the scan is conservative, and
                # a freed copy of a key would pass for a reference to it
                if _lib.has("capsan_scope_dlpack_leaks"):
                    _lib.scope_dlpack_leaks(since)
                if _all_held(since, skip_frames):
                    return
        gc.collect()
        # tensors consumed in the scope and referenced nowhere any more
        # first: the NumPy buffers they keep alive are their indirect part
        if since and _lib.has("capsan_scope_dlpack_leaks"):
            _lib.scope_dlpack_leaks(since)
        if h is not None:
            held = ()
            if self.roots and _lib.has("capsan_handler_live"):
                from .reach import reached_blocks
                held = reached_blocks(_lib.handler_live(h, since or 0), skip_frames)
            _lib.handler_leaks(h, held, since or 0)

    def _collect(self, cursor):
        if _lib.findings_count() <= cursor:
            return  # nothing reported since: no JSON to make and parse
        new = parse(_lib.findings_json(cursor))
        with self._lock:
            for i, f in enumerate(new):
                n = cursor + i
                if n not in self._seen:
                    self._seen.add(n)
                    self._findings.append(f)

    @property
    def active(self) -> bool:
        return bool(self._scopes)

    # ---- decorator ----
    def __call__(self, fn):
        check = True if self.check is None else self.check

        def scope():
            t = Trace(self.inner, allow=self.allow, check=False, leaks=self.leaks,
                      roots=self.roots)
            return t

        def merge(t):
            with self._lock:
                self._findings.extend(t._findings)

        if inspect.iscoroutinefunction(fn):
            @functools.wraps(fn)
            async def awrapper(*a, **kw):
                t = scope()
                try:
                    with t:
                        r = await fn(*a, **kw)
                finally:
                    merge(t)
                if check:
                    t.assert_clean(self.allow)
                return r
            awrapper.capsan_trace = self
            return awrapper

        @functools.wraps(fn)
        def wrapper(*a, **kw):
            t = scope()
            try:
                with t:
                    r = fn(*a, **kw)
            finally:
                merge(t)
            if check:
                t.assert_clean(self.allow)
            return r
        wrapper.capsan_trace = self
        return wrapper

    # ---- results ----
    @property
    def findings(self) -> list:
        """Findings of the closed scopes, plus (while a scope is open) the
        ones reported so far (leaks are judged only at exit)."""
        with self._lock:
            out = list(self._findings)
            cursor = self._scopes[0][2] if self._scopes else None
        if cursor is not None:
            live = parse(_lib.findings_json(cursor))
            out += [f for i, f in enumerate(live) if cursor + i not in self._seen]
        return out

    def by_kind(self, kind) -> list:
        return [f for f in self.findings if matches(f.kind, [kind])]

    @property
    def kinds(self) -> set:
        return {f.kind for f in self.findings}

    def unexpected(self, allow=None) -> list:
        allow = self.allow if allow is None else list(allow)
        return [f for f in self.findings if not matches(f.kind, allow)]

    def assert_clean(self, allow=None):
        """Raise AssertionError, with the LeakSanitizer-style report, when
        there are findings whose kind is not in `allow` (exact kinds, globs
        such as "numpy-*", or "leak" for every *-leak kind)."""
        bad = self.unexpected(allow)
        if bad:
            raise AssertionError(
                f"capsan: {len(bad)} finding(s) in the traced scope\n" + render_text(bad))

    def report(self, format="text") -> str:
        """`text`: the LeakSanitizer-style report; `json`: the contract's JSON
        report (DESIGN.md) with this process and this scope's findings."""
        fs = self.findings
        if format == "text":
            return render_text(fs)
        if format == "json":
            leaks = [f for f in fs if f.kind.endswith("-leak")]
            per = {}
            for f in fs:
                per[f.kind] = per.get(f.kind, 0) + 1
            proc = {
                "pid": os.getpid(), "ppid": os.getppid(), "argv": list(sys.argv),
                "ended": "unknown", "status": 0, "scope": "trace",
                "findings": [f.raw for f in fs],
                "summary": {"errors": sum(f.severity != "warning" for f in fs),
                            "warnings": sum(f.severity == "warning" for f in fs),
                            "leaked_bytes": sum(f.bytes for f in leaks),
                            "leak_objects": sum(f.count for f in leaks),
                            "events": sum(len(f.events) for f in fs), "per_kind": per},
            }
            return json.dumps({"tool": "capsan", "format": 1, "processes": [proc]}, indent=1)
        raise ValueError(f"capsan: unknown report format {format!r} (text or json)")

    def __repr__(self) -> str:
        state = "open" if self._scopes else "closed"
        return f"<capsan.Trace {state}, {len(self.findings)} finding(s)>"


def trace(inner=None, *, allow=(), check=None, leaks=True, roots=False) -> Trace:
    """A tracing scope: `with capsan.trace() as t:` or `@capsan.trace()`.
    See Trace."""
    return Trace(inner, allow=allow, check=check, leaks=leaks, roots=roots)
