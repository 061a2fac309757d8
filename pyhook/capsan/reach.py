"""Which NumPy blocks the running program still reaches from Python's roots.

A scope's block that is still alive at its end is either held (a module
global, a cache, a class attribute, a session fixture still refers to its
array) or leaked (only a reference that no Python object accounts for keeps
it alive: a C extension that took a reference and lost it). LeakSanitizer
draws the same line with its root set (globals, thread stacks): what the
roots reach is "still reachable", not a leak.

The roots here are every loaded module, gc.garbage and the local variables
of every frame that is still running, minus the frames that asked (the
caller's own `with` block is not a root: what it holds at the scope's end
is the scope's). The runtime walks from them (capsan_reached, pyreach.c):
what each object's tp_traverse visits, as gc.get_referents does (so into
containers the collector does not track, such as a dict holding only
arrays), an array's `base`, and the tensor of an unconsumed DLPack capsule
(numpy's export holds its array's block). An array's block is the address
in its `data` field. The same walk, from the frames of the threads still
running at exit, decides what a daemon thread holds under `capsan run`.
"""
from __future__ import annotations

import ctypes
import gc
import sys

from . import _lib


def _frame_roots(skip_frames):
    """The local variables of every running frame, outside skip_frames."""
    out = []
    seen = set()
    for top in sys._current_frames().values():
        f = top
        while f is not None and id(f) not in seen:
            seen.add(id(f))
            if not any(f is s for s in skip_frames):
                try:
                    out.extend(f.f_locals.values())
                except Exception:  # a frame being torn down
                    pass
            f = f.f_back
    return out


def reached_blocks(candidates, skip_frames=()) -> set:
    """The addresses among `candidates` (NumPy block addresses) that an array
    reachable from the roots has as its data."""
    want = sorted(set(candidates))
    if not want or "numpy" not in sys.modules or not _lib.has("capsan_reached"):
        return set()
    roots = list(sys.modules.values()) + list(gc.garbage) + _frame_roots(skip_frames)
    arr = (ctypes.c_uint64 * len(want))(*want)
    found = (ctypes.c_uint8 * len(want))()
    _lib.call("capsan_reached", roots, arr, len(want), found)
    return {w for w, f in zip(want, found) if f}
