"""DLPack 1.3's C exchange API as Python sees it: the DLPackExchangeAPI
table a type offers in ``__dlpack_c_exchange_api__`` (a capsule named
``dlpack_exchange_api``) or, in the DLPack 1.2 form, as an int in
``__c_dlpack_exchange_api__``.

follow_loaded() hands every table of the types already imported to the
runtime, which patches it in place: a consumer that cached a table before
``import capsan`` is then seen too (a preloaded runtime sees each table
when its capsule is made or read). table_info() reads one table for
describe()."""
from __future__ import annotations

import ctypes
import sys

from . import _lib

CAPSULE_ATTR = "__dlpack_c_exchange_api__"
INT_ATTR = "__c_dlpack_exchange_api__"
ENTRIES = ("managed_tensor_allocator", "managed_tensor_from_py_object_no_sync",
           "managed_tensor_to_py_object_no_sync", "dltensor_from_py_object_no_sync",
           "current_work_stream")


def table_of(tp) -> int | None:
    """The address of the table type `tp` carries (its own or inherited), or
    None. Reading it records nothing: an inspection is not a consumer."""
    for klass in getattr(tp, "__mro__", ()):
        d = vars(klass)
        cap = d.get(CAPSULE_ATTR)
        if cap is not None and type(cap).__name__ == "PyCapsule":
            p = _lib.call("capsan_capsule_peek", cap) if _lib.has("capsan_capsule_peek") else None
            return p or None
        val = d.get(INT_ATTR)
        if isinstance(val, int) and val > 0:
            return val
    return None


_seen_modules: set = set()
_looked = (0, None)  # sys.modules' size and last name at the last look


def start() -> bool:
    """Start the runtime, then follow the exchange tables a consumer may have
    cached before capsan started (what capsan.start() and trace() do)."""
    on = _lib.start()
    if on:
        follow_loaded()
    return on


def follow_loaded() -> int:
    """Give the runtime the tables of every type in the modules loaded so
    far (each module looked at once). Returns how many were found."""
    global _looked
    if not _lib.has("capsan_xapi_follow"):
        return 0
    # a new name goes to the end of sys.modules: same size and same last
    # name, nothing new to look at (the pytest plugin asks at every test)
    mods = sys.modules
    now = (len(mods), next(reversed(mods), None))
    if now == _looked:
        return 0
    _looked = now
    n = 0
    for name, mod in list(mods.items()):
        if name in _seen_modules or mod is None:
            continue
        _seen_modules.add(name)
        try:
            members = list(vars(mod).values())
        except TypeError:
            continue
        for obj in members:
            # type(obj), not isinstance: a module attribute may be a proxy
            # whose __class__ warns or imports (torch.distributed.reduce_op)
            if issubclass(type(obj), type) and (CAPSULE_ATTR in vars(obj) or INT_ATTR in vars(obj)):
                p = table_of(obj)
                if p:
                    _lib.call("capsan_xapi_follow", ctypes.c_void_p(p))
                    n += 1
    return n


class _Header(ctypes.Structure):
    _fields_ = [("major", ctypes.c_uint32), ("minor", ctypes.c_uint32),
                ("prev_api", ctypes.c_void_p)] + [(e, ctypes.c_void_p) for e in ENTRIES]


def table_info(addr: int, symbolize) -> dict:
    """{'address', 'version', 'prev_api', 'entries': {name: {..symbolized,
    'patched_by_capsan'}}} of the table at addr; the entries are the
    producer's, also where capsan patched them in place."""
    h = _Header.from_address(addr)
    out = {"address": addr, "version": [h.major, h.minor], "prev_api": h.prev_api or None,
           "entries": {}, "shadow": symbolize(addr).get("module") == "libcapsan.so"}
    for i, name in enumerate(ENTRIES, 1):
        now = getattr(h, name) or 0
        orig = now
        if _lib.has("capsan_xapi_original"):
            orig = _lib.call("capsan_xapi_original", ctypes.c_void_p(addr), i) or 0
        e = symbolize(orig) if orig else {"address": 0, "module": None, "symbol": None,
                                          "offset": None, "path": None}
        e["patched_by_capsan"] = bool(now and orig and now != orig)
        out["entries"][name] = e
    if h.prev_api:
        out["prev"] = table_info(h.prev_api, symbolize)
    return out


def render(info: dict, indent: str = "  ") -> list:
    v = info["version"]
    lines = [f"{indent}DLPack exchange table {info['address']:#x} (version {v[0]}.{v[1]}), "
             f"prev_api {'NULL' if not info['prev_api'] else hex(info['prev_api'])}"
             + (" [capsan's forwarding copy of a read-only table]" if info.get("shadow") else "")]
    for name, e in info["entries"].items():
        if not e["address"]:
            where = "NULL"
        else:
            where = f"{e['address']:#x}"
            if e.get("symbol"):
                where += f" {e['symbol']}+{e['offset']:#x}"
            if e.get("module"):
                where += f" ({e['module']})"
        if e.get("patched_by_capsan"):
            where += " [followed by capsan]"
        lines.append(f"{indent}  {name:40s} {where}")
    if info.get("prev"):
        lines += render(info["prev"], indent + "  ")
    return lines
