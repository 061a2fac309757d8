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
is the scope's). The walk follows gc.get_referents, which also sees into
containers the collector does not track (a dict holding only arrays is
untracked), and an array's `base` (an array does not report what it refers
to). An array's block is the address in its `data` field; a DLPack capsule
not yet consumed (an export kept for later) reaches the data its tensor
describes, which for numpy's export is the array's block.
"""
from __future__ import annotations

import gc
import sys

# PyArrayObject_fields: PyObject_HEAD, then `char *data` (numpy 1.x and 2.x)
_DATA_OFFSET = 2 * 8 if sys.maxsize > 2**32 else 2 * 4


def _data_of(arr) -> int:
    import ctypes
    return ctypes.c_void_p.from_address(id(arr) + _DATA_OFFSET).value or 0


_CAPSULE_NAMES = {b"dltensor": 0, b"dltensor_versioned": 32}  # dl_tensor's offset


def _capsule_data(cap) -> int:
    """The data pointer of the tensor an unconsumed DLPack capsule holds, or 0."""
    import ctypes
    from . import _lib
    get_name = ctypes.pythonapi.PyCapsule_GetName
    get_name.argtypes, get_name.restype = [ctypes.py_object], ctypes.c_char_p
    name = get_name(cap)
    if name not in _CAPSULE_NAMES or not _lib.has("capsan_capsule_peek"):
        return 0
    mt = _lib.call("capsan_capsule_peek", cap)  # the pointer, not consumed
    return ctypes.c_void_p.from_address(mt + _CAPSULE_NAMES[name]).value or 0 if mt else 0


def _frame_roots(skip_frames):
    """The local variables of every running frame, outside skip_frames."""
    out = []
    seen = set()
    for top in sys._current_frames().values():
        f = top
        while f is not None and id(f) not in seen:
            seen.add(id(f))
            if f not in skip_frames:
                try:
                    out.extend(f.f_locals.values())
                except Exception:  # a frame being torn down
                    pass
            f = f.f_back
    return out


def reached_blocks(candidates, skip_frames=()) -> set:
    """The addresses among `candidates` (NumPy block addresses) that an array
    reachable from the roots has as its data."""
    want = set(candidates)
    if not want:
        return set()
    ndarray = sys.modules["numpy"].ndarray if "numpy" in sys.modules else None
    if ndarray is None:
        return set()
    import datetime
    capsule = type(datetime.datetime_CAPI)  # types.CapsuleType from 3.13 on
    roots = list(sys.modules.values()) + list(gc.garbage) + _frame_roots(set(skip_frames))
    seen = set(map(id, roots))
    # the walk's own objects are not roots of anything
    seen.update(map(id, (roots, want)))
    found = set()
    frontier = roots
    while frontier:
        # type(o), never isinstance(): an object's own __class__ may run code
        arrays = [o for o in frontier if issubclass(type(o), ndarray)]
        for d in [_data_of(a) for a in arrays] + [
                _capsule_data(o) for o in frontier if type(o) is capsule]:
            if d in want:
                found.add(d)
        if len(found) == len(want):
            break
        nxt = []
        for o in gc.get_referents(*frontier) + [a.base for a in arrays if a.base is not None]:
            i = id(o)
            if i not in seen:
                seen.add(i)
                nxt.append(o)
        frontier = nxt
    return found
