"""Findings as Python objects, built from the runtime's JSON (the contract's
finding objects, DESIGN.md), and their LeakSanitizer-style text."""
from __future__ import annotations

import fnmatch
import json
import os
import sys
import sysconfig

__all__ = ["Frame", "Event", "Finding", "parse", "render_text", "summary_line", "matches"]


def _library_dirs():
    dirs = set()
    for key in ("stdlib", "platstdlib", "purelib", "platlib"):
        p = sysconfig.get_paths().get(key)
        if p:
            dirs.add(os.path.realpath(p))
    for p in sys.path:
        if p and os.path.basename(p.rstrip("/")) in ("site-packages", "dist-packages"):
            dirs.add(os.path.realpath(p))
    dirs.add(os.path.dirname(os.path.realpath(__file__)))  # capsan itself
    return tuple(d.rstrip("/") + "/" for d in dirs)


_LIBDIRS = None


def _is_library_file(path: str) -> bool:
    global _LIBDIRS
    if _LIBDIRS is None:
        _LIBDIRS = _library_dirs()
    if path in ("<string>", "<stdin>"):
        return False  # python -c / a REPL: the user's own code
    if not path or path.startswith("<"):
        return True
    rp = os.path.realpath(path)
    return rp.startswith(_LIBDIRS)


class Frame:
    """One stack frame: a Python frame (file, line, function) or a native
    one (module, address, offset in the module, function and, once
    symbolized, file:line)."""

    __slots__ = ("python", "file", "line", "function", "module", "address", "raw",
                 "module_path", "offset", "build_id", "inlined")

    def __init__(self, d: dict):
        self.raw = d
        self.python = bool(d.get("python"))
        self.file = d.get("file") or ""
        self.line = int(d.get("line") or 0)
        self.function = d.get("function") or ""
        self.module = d.get("module") or ""
        self.address = d.get("address") or ""
        self.module_path = d.get("module_path") or ""
        self.offset = d.get("offset") or ""
        self.build_id = d.get("build_id") or ""
        self.inlined = bool(d.get("inlined"))

    @property
    def where(self) -> str:
        """`file.py:12` for Python frames (base name), `module+function` for native ones."""
        if self.python:
            return f"{os.path.basename(self.file)}:{self.line}"
        if self.file:
            return f"{os.path.basename(self.file)}:{self.line}" if self.line else os.path.basename(self.file)
        return f"{self.function or '?'} ({self.module or '?'})"

    def __str__(self) -> str:
        """As the runtime's text renders it (model/render.c)."""
        if self.python:
            return f"{self.file or '<unknown>'}:{self.line} in {self.function or '<unknown>'}"
        s = f"{self.address or '0x0'}"
        off = f"+{self.offset}" if self.offset else ""
        if self.function:
            s += f" in {self.function}"
            if self.file:
                s += f" {self.file}" + (f":{self.line}" if self.line else "")
            elif self.module:
                s += f" ({self.module}{off})"
        elif self.module_path or self.module:
            s += f" ({self.module_path or self.module}{off})"
            if self.build_id:
                s += f" (BuildId: {self.build_id})"
        else:
            s += " (<unknown module>)"
        return s

    def __repr__(self) -> str:
        return f"Frame({str(self)!r})"


class Event:
    """One recorded event of a finding's object: `event` ("alloc", "free",
    "handler", "export", "consume", "delete", ...), the thread number, the
    time in ns since the process started and the stack, innermost first."""

    __slots__ = ("event", "phrase", "thread", "time_ns", "flags", "stack", "raw", "named")

    def __init__(self, d: dict):
        self.raw = d
        self.event = d.get("event", "")
        self.phrase = d.get("phrase") or ""
        self.thread = int(d.get("thread") or 0)
        self.time_ns = int(d.get("time_ns") or 0)
        self.flags = int(d.get("flags") or 0)
        self.stack = [Frame(f) for f in d.get("stack") or []]
        self.named = False            # add_source_lines() ran over it

    @property
    def python_stack(self) -> list:
        return [f for f in self.stack if f.python]

    def __repr__(self) -> str:
        top = user_frame(self.stack)
        return f"Event({self.event!r}, thread={self.thread}, at={top.where if top else None!r})"


def user_frame(stack):
    """The innermost Python frame outside the stdlib, site/dist-packages and
    capsan itself (the line a user wrote); else the innermost Python frame."""
    py = [f for f in stack if f.python]
    for f in py:
        if not _is_library_file(f.file):
            return f
    return py[0] if py else None


class Finding:
    """A finding reported by the runtime.

    kind, severity ("error"/"warning"), message, bytes, object ({"type",
    "address"}), events (list of Event), stack (the first event's stack),
    count (objects grouped into it, 1 unless the runtime grouped leaks) and
    raw (the JSON object as the runtime wrote it)."""

    def __init__(self, d: dict):
        self.raw = d
        self.kind = d.get("kind", "")
        self.severity = d.get("severity", "error")
        self.message = d.get("message", "")
        self.bytes = int(d.get("bytes") or 0)
        self.object = d.get("object") or {}
        self.count = int(d.get("count") or 1)
        self.events = [Event(e) for e in d.get("events") or []]
        # LeakSanitizer's indirect leaks: what only this leak keeps alive
        self.indirect = d.get("indirect") or []
        self.indirect_bytes = int(d.get("indirect_bytes") or 0)
        self.indirect_objects = int(d.get("indirect_objects") or 0)
        first = (self.indirect[0].get("events") or [{}])[0] if self.indirect else {}
        #: where the first of the indirect leaks was allocated
        self.indirect_event = Event(first) if first else None

    @property
    def stack(self) -> list:
        return self.events[0].stack if self.events else []

    @property
    def frame(self):
        """The user's frame where it started (see `at`), or None."""
        for ev in self.events:
            f = user_frame(ev.stack)
            if f is not None:
                return f
        return None

    @property
    def at(self):
        """`file.py:LINE` of the first event's user frame, or None."""
        f = self.frame
        return f.where if f else None

    def python_lines(self, event=None):
        """Every (basename, line) of a Python frame in the events' stacks."""
        out = []
        for ev in self.events:
            if event is None or ev.event == event:
                out += [(os.path.basename(f.file), f.line) for f in ev.stack if f.python]
        return out

    def happened_at(self, file, line, event=None) -> bool:
        """True when an event (of that name) has a Python frame at file:line."""
        return (os.path.basename(str(file)), int(line)) in self.python_lines(event)

    def __repr__(self) -> str:
        return f"Finding(kind={self.kind!r}, bytes={self.bytes}, at={self.at!r})"

    def format(self, pid=None) -> str:
        return render_finding(self, pid)


def parse(text_or_list) -> list:
    data = json.loads(text_or_list) if isinstance(text_or_list, (str, bytes)) else text_or_list
    if isinstance(data, dict):  # a whole report: every process's findings
        data = [f for p in data.get("processes", []) for f in p.get("findings", [])]
    return [Finding(d) for d in data or []]


def matches(kind: str, patterns) -> bool:
    """`kind` is allowed by one of `patterns` (exact names, globs such as
    "numpy-*", or "leak" for every *-leak kind, as in LeakSanitizer's
    suppressions)."""
    for p in patterns or ():
        if p == kind or fnmatch.fnmatchcase(kind, p) or (p == "leak" and kind.endswith("-leak")):
            return True
    return False


# ---- text --------------------------------------------------------------

_RULE = "=" * 65


def render_finding(f: Finding, pid=None, cut=None) -> str:
    """LeakSanitizer-style text. `cut(frame)`, when given, ends each stack
    at the first frame for which it is true (a harness's own frames)."""
    add_source_lines([f])
    pid = os.getpid() if pid is None else pid
    word = "WARNING" if f.severity == "warning" else "ERROR"
    lines = [_RULE, f"=={pid}=={word}: capsan: {f.kind}: {f.message}"]
    if f.count > 1:
        lines.append(f"  ({f.count} objects, {f.bytes} byte(s) in all)")
    for ev in f.events:
        head = ev.phrase or f"{ev.event} at"
        lines.append(f"  {head} (thread T{ev.thread}):")
        if not ev.stack:
            lines.append("    <no stack recorded>")
        for k, fr in enumerate(ev.stack):
            if cut is not None and k and cut(fr):
                lines.append(f"    ... {len(ev.stack) - k} more frame(s)")
                break
            lines.append(f"    #{k} {fr}")
    if not f.events:
        lines.append("  <no events recorded>")
    if f.indirect_objects:
        lines.append(f"Indirect leak of {f.indirect_bytes} byte(s) in {f.indirect_objects} "
                     "object(s) allocated from:")
        stack = f.indirect_event.stack if f.indirect_event else []
        for k, fr in enumerate(stack):
            if cut is not None and k and cut(fr):
                lines.append(f"    ... {len(stack) - k} more frame(s)")
                break
            lines.append(f"    #{k} {fr}")
    return "\n".join(lines) + "\n"


def summary_line(findings) -> str:
    errors = sum(1 for f in findings if f.severity != "warning")
    warnings = len(findings) - errors
    per = {}
    for f in findings:
        per[f.kind] = per.get(f.kind, 0) + 1
    s = f"SUMMARY: capsan: {errors} error(s), {warnings} warning(s)"
    if per:
        s += " [" + ", ".join(f"{k}: {n}" for k, n in per.items()) + "]"
    leaks = [f for f in findings if f.kind.endswith("-leak")]
    s += (f"; {sum(f.bytes for f in leaks)} byte(s) leaked in "
          f"{sum(f.count for f in leaks)} object(s).")
    return s


def render_text(findings, pid=None, cut=None) -> str:
    add_source_lines(findings)
    return ("".join(render_finding(f, pid, cut) + "\n" for f in findings)
            + summary_line(findings) + "\n")


# ---- file:line of native frames ---------------------------------------

# (module path, offset, build id) -> the frames `capsan symbolize` named there
_SOURCE = {}


def _symbolizer():
    """The capsan command beside the runtime (as `python -m capsan` finds it)."""
    from . import _lib
    if _lib.load_error is not None or not _lib.path or not os.path.isabs(_lib.path):
        return None
    cli = os.path.join(os.path.dirname(os.path.dirname(_lib.path)), "bin", "capsan")
    return cli if os.access(cli, os.X_OK) else None


def _ask(keys):
    for key in keys:
        _SOURCE[key] = []             # asked once, answered or not
    cli = _symbolizer()
    if cli is None:
        return
    import subprocess
    env = dict(os.environ)
    # the command is no Python program to trace
    pre = [p for p in env.get("LD_PRELOAD", "").split(":") if p and "libcapsan" not in p]
    if pre:
        env["LD_PRELOAD"] = ":".join(pre)
    else:
        env.pop("LD_PRELOAD", None)
    text = "".join(f"{path}\t{off}\t{bid}\n" for path, off, bid in keys)
    try:
        cp = subprocess.run([cli, "symbolize"], input=text, capture_output=True, text=True,
                            env=env, timeout=60, errors="replace")
    except (OSError, subprocess.SubprocessError):
        return
    out = cp.stdout.splitlines()
    if cp.returncode != 0 or len(out) != len(keys):
        return
    for key, line in zip(keys, out):
        try:
            _SOURCE[key] = [d for d in json.loads(line) if isinstance(d, dict)]
        except ValueError:
            _SOURCE[key] = []


def _named(fr, keys_only=False):
    """The frames DWARF gives for a native frame, innermost first (the
    frame itself when it has nothing to add)."""
    if fr.python or fr.file or not fr.module_path.startswith("/") or not fr.offset:
        return None if keys_only else [fr]
    key = (fr.module_path, fr.offset, fr.build_id)
    if keys_only:
        return key
    got = _SOURCE.get(key)
    if not got:
        return [fr]
    out = []
    for d in got:
        raw = dict(fr.raw, function=d.get("function") or fr.function, file=d.get("file") or "",
                   line=int(d.get("line") or 0), inlined=bool(d.get("inlined")))
        out.append(Frame(raw))
    return out


def add_source_lines(findings):
    """Give the native frames of these findings file:line, and their
    inlined calls, where the module has DWARF: the runtime names each
    function (its symbol table) but reads no DWARF, so this asks the
    capsan command, out of process and once for every frame not asked
    about before. Only text rendering calls it: a finding that is never
    shown costs nothing."""
    events = []
    for f in findings:
        events += f.events
        if f.indirect_event is not None:
            events.append(f.indirect_event)
    events = [ev for ev in events if not ev.named]
    keys = []
    for ev in events:
        for fr in ev.stack:
            key = _named(fr, keys_only=True)
            if key is not None and key not in _SOURCE and key not in keys:
                keys.append(key)
    if keys:
        _ask(keys)
    for ev in events:
        ev.stack = [g for fr in ev.stack for g in _named(fr)]
        ev.named = True
