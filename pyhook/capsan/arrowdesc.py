"""capsan.describe() of the Arrow PyCapsule interface: an ``arrow_*``
capsule, or an object with ``__arrow_c_schema__`` / ``__arrow_c_array__`` /
``__arrow_c_stream__``.

    >>> print(capsan.describe(pa.array([1, 2, 3])))
    Arrow capsule 'arrow_schema' from pyarrow/lib.cpython-311-x86_64-linux-gnu.so
      schema format 'l' name '' children 0 flags 2 (nullable)  release set
    Arrow capsule 'arrow_array' from pyarrow/lib.cpython-311-x86_64-linux-gnu.so
      array length 3 null_count 0 offset 0 buffers 2 children 0  release set
      checks: ok

An object is asked for its capsules the way a consumer asks, and they are
dropped unconsumed: their destructors release the structs (R41), nothing
is moved. A raw capsule is read with the runtime's peek, which records no
consumer. The producing library is the module of the capsule's destructor
(under capsan: the destructor capsan's trampoline stands for) or of the
struct's own release callback.
"""
from __future__ import annotations

import ctypes
from ctypes import POINTER, Structure, c_char_p, c_int64, c_void_p

NAMES = ("arrow_schema", "arrow_array", "arrow_array_stream", "arrow_device_array",
         "arrow_device_array_stream")
_TYPE = {n: i + 1 for i, n in enumerate(NAMES)}


class ArrowSchema(Structure):
    pass


ArrowSchema._fields_ = [("format", c_char_p), ("name", c_char_p), ("metadata", c_void_p),
                        ("flags", c_int64), ("n_children", c_int64),
                        ("children", POINTER(POINTER(ArrowSchema))),
                        ("dictionary", POINTER(ArrowSchema)), ("release", c_void_p),
                        ("private_data", c_void_p)]


class ArrowArray(Structure):
    _fields_ = [("length", c_int64), ("null_count", c_int64), ("offset", c_int64),
                ("n_buffers", c_int64), ("n_children", c_int64), ("buffers", c_void_p),
                ("children", c_void_p), ("dictionary", c_void_p), ("release", c_void_p),
                ("private_data", c_void_p)]


class ArrowArrayStream(Structure):
    _fields_ = [("get_schema", c_void_p), ("get_next", c_void_p), ("get_last_error", c_void_p),
                ("release", c_void_p), ("private_data", c_void_p)]


class ArrowDeviceArray(Structure):
    _fields_ = [("array", ArrowArray), ("device_id", c_int64), ("device_type", ctypes.c_int32),
                ("sync_event", c_void_p), ("reserved", c_int64 * 3)]


class ArrowDeviceArrayStream(Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("get_schema", c_void_p), ("get_next", c_void_p),
                ("get_last_error", c_void_p), ("release", c_void_p), ("private_data", c_void_p)]


_STRUCT = {1: ArrowSchema, 2: ArrowArray, 3: ArrowArrayStream, 4: ArrowDeviceArray,
           5: ArrowDeviceArrayStream}
_FLAGS = {1: "dictionary_ordered", 2: "nullable", 4: "map_keys_sorted"}


DUNDERS = ("__arrow_c_schema__", "__arrow_c_array__", "__arrow_c_stream__")


def arrow_dunders(t) -> list:
    """The Arrow PyCapsule dunders type t has."""
    return [m for m in DUNDERS if hasattr(t, m)]


def is_arrow(obj) -> bool:
    """An Arrow capsule, or an object with an Arrow dunder (and no DLPack one)."""
    from . import dlpack as D
    if type(obj).__name__ == "PyCapsule":
        return D.capsule_name(obj) in NAMES
    t = type(obj)
    return not hasattr(t, "__dlpack__") and bool(arrow_dunders(t))


def _original_release(p: int, typ: int) -> int:
    from . import _lib
    if not _lib.has("capsan_arrow_original"):
        return 0
    return _lib.call("capsan_arrow_original", p, typ, 0) or 0


def _read_struct(d: dict, ptr: int, typ: int, symbolize, readable) -> None:
    """The struct of cs_ar_type typ at ptr, into d (struct, released, release)."""
    st = _STRUCT[typ]
    if not readable(ptr, ctypes.sizeof(st)):
        d["unreadable"] = True
        return
    s = st.from_address(ptr)
    rel = s.array.release if typ == 4 else s.release
    d["released"] = not rel
    if rel:
        orig = _original_release(ptr, typ)
        d["wrapped_by_capsan"] = d["wrapped_by_capsan"] or bool(orig)
        d["release"] = symbolize(orig or rel)
    if typ == 1:
        kids = []
        for i in range(min(s.n_children, 64) if s.children and rel else 0):
            c = s.children[i]
            if c:
                kids.append({"format": (c.contents.format or b"").decode(errors="replace"),
                             "name": (c.contents.name or b"").decode(errors="replace")})
        d["struct"] = {"type": "ArrowSchema",
                       "format": (s.format or b"").decode(errors="replace") if rel else None,
                       "name": (s.name or b"").decode(errors="replace") if rel else None,
                       "flags": s.flags, "n_children": s.n_children, "children": kids,
                       "dictionary": bool(s.dictionary)}
    elif typ in (2, 4):
        a = s.array if typ == 4 else s
        d["struct"] = {"type": st.__name__, "length": a.length, "null_count": a.null_count,
                       "offset": a.offset, "n_buffers": a.n_buffers, "n_children": a.n_children,
                       "dictionary": bool(a.dictionary)}
        if typ == 4:
            d["struct"].update(device_type=s.device_type, device_id=s.device_id)
    else:
        d["struct"] = {"type": st.__name__, "callbacks": {
            k: bool(getattr(s, k)) for k in ("get_schema", "get_next", "get_last_error")}}


def _read_capsule(cap, symbolize, original, is_capsan, readable) -> dict:
    from . import dlpack as D
    name = D.capsule_name(cap)
    ptr = D.capsule_pointer(cap)
    dtor = symbolize(D.capsule_destructor(cap))
    wrapped = is_capsan(dtor)
    if wrapped:
        orig = original("destructor", id(cap))
        if orig:
            dtor = symbolize(orig)
    typ = _TYPE[name]
    d = {"name": name, "pointer": ptr, "destructor": dtor, "wrapped_by_capsan": wrapped,
         "struct": None, "released": None, "release": None, "producer": None}
    _read_struct(d, ptr, typ, symbolize, readable)
    mod = (d["destructor"] or {}).get("module") if not is_capsan(d["destructor"] or {}) else None
    d["producer"] = mod or ((d["release"] or {}).get("module"))
    return d


# capsan_arrow_at()'s bits (capsan.h CS_AT_*)
_AT_RELEASED, _AT_EMPTY, _AT_BY_ADDR, _AT_IMPORTED, _AT_CAPSULE, _AT_CHILD = (
    0x100, 0x200, 0x400, 0x800, 0x1000, 0x2000)


def describe_address(p: int, symbolize, readable) -> dict:
    """The description of an Arrow struct at address p, if capsan follows
    one there (handed over by address, R49, or a capsule's): its fields and
    where it stands in its life."""
    from . import _lib
    at = _lib.call("capsan_arrow_at", p) if _lib.has("capsan_arrow_at") else 0
    d = {"protocol": "arrow", "source": "address", "address": p, "object_type": None,
         "capsule": {"name": None}, "capsules": [], "checks": [], "verdict": "ok",
         "followed": bool(at), "state": None}
    if not at:
        d["verdict"] = "unknown"
        return d
    typ = at & 0xFF
    e = {"name": _STRUCT[typ].__name__, "pointer": p, "destructor": None,
         "wrapped_by_capsan": True, "struct": None, "released": None, "release": None,
         "producer": None}
    _read_struct(e, p, typ, symbolize, readable)
    # the producer's release, which capsan's record keeps also once moved out
    orig = _original_release(p, typ)
    e["producer"] = (symbolize(orig) if orig else e["release"] or {}).get("module")
    d["capsules"].append(e)
    how = ("a child or dictionary of an exported struct" if at & _AT_CHILD
           else "in a live capsule" if at & _AT_CAPSULE
           else "handed over by address" if at & (_AT_BY_ADDR | _AT_IMPORTED)
           else "moved out of its capsule")
    if at & _AT_RELEASED:
        state = "released"
    elif at & _AT_EMPTY:
        state = "moved out (release == NULL here; a copy elsewhere owns it)"
    elif at & _AT_IMPORTED:
        state = "imported: the importer owns its release"
    else:
        state = "live: its holder must import or release it"
    d["state"] = f"{how}, {state}"
    return d


def describe_arrow(obj, symbolize, original, is_capsan, readable) -> dict:
    """The description dict of an Arrow capsule or object (describe.py renders it)."""
    d = {"protocol": "arrow", "source": None, "object_type": None, "capsule": {"name": None},
         "capsules": [], "checks": [], "verdict": "ok"}
    caps = []
    if type(obj).__name__ == "PyCapsule":
        d["source"] = "capsule"
        caps = [obj]
    else:
        d["source"] = "object"
        t = type(obj)
        d["object_type"] = f"{t.__module__}.{t.__qualname__}"
        if hasattr(t, "__arrow_c_schema__"):
            caps.append(obj.__arrow_c_schema__())
        if hasattr(t, "__arrow_c_array__"):
            caps.extend(obj.__arrow_c_array__())
        elif hasattr(t, "__arrow_c_stream__"):
            caps.append(obj.__arrow_c_stream__())
    for cap in caps:
        c = _read_capsule(cap, symbolize, original, is_capsan, readable)
        d["capsules"].append(c)
        if c["released"] and d["source"] == "object":
            d["checks"].append({"rule": "R43", "verdict": "fail",
                                "message": f"{c['name']}: handed out already released"})
        elif c.get("unreadable"):
            d["checks"].append({"rule": "R40", "verdict": "fail",
                                "message": f"{c['name']}: its pointer is not readable"})
    if d["checks"]:
        d["verdict"] = "fail"
    d["capsule"]["name"] = d["capsules"][0]["name"] if d["capsules"] else None
    del caps  # dropped unconsumed: their destructors release them (R41)
    return d


def render(d: dict) -> str:
    out = []
    if d["source"] == "address":
        if not d["followed"]:
            return f"{d['address']:#x}: capsan follows no Arrow struct at this address"
        out.append(f"{d['capsules'][0]['name']} at {d['address']:#x}, followed by capsan: "
                   f"{d['state']}")
    if d["object_type"]:
        out.append(f"{d['object_type']}: Arrow PyCapsule interface")
    for c in d["capsules"]:
        src = c["producer"] or "unknown module"
        if d["source"] == "address":
            out.append(f"  from {src}")
        else:
            out.append(f"Arrow capsule '{c['name']}' from {src}"
                       + ("  (followed by capsan)" if c["wrapped_by_capsan"] else ""))
        s = c["struct"] or {}
        state = "released (release == NULL)" if c["released"] else "release set"
        if s.get("type") == "ArrowSchema":
            flags = ", ".join(v for k, v in _FLAGS.items() if s["flags"] & k) or "none"
            kids = " ".join(f"{k['name']}:{k['format']}" for k in s["children"])
            out.append(f"  schema format {s['format']!r} name {s['name']!r} children "
                       f"{s['n_children']}{' (' + kids + ')' if kids else ''} flags "
                       f"{s['flags']} ({flags})  {state}")
        elif "length" in s:
            dev = f" device {s['device_type']}:{s['device_id']}" if "device_type" in s else ""
            out.append(f"  array length {s['length']} null_count {s['null_count']} offset "
                       f"{s['offset']} buffers {s['n_buffers']} children {s['n_children']}"
                       f"{dev}  {state}")
        elif s:
            cbs = " ".join(k for k, v in s["callbacks"].items() if v)
            out.append(f"  stream callbacks {cbs}  {state}")
    out.append("  checks: " + ("ok" if not d["checks"] else
                               "; ".join(f"{c['rule']} {c['message']}" for c in d["checks"])))
    return "\n".join(out)
