"""capsan.describe(): what a DLPack capsule really holds, and whether it is right
(an Arrow capsule or object with the Arrow dunders: arrowdesc.py).

    >>> print(capsan.describe(torch.arange(6).reshape(2, 3)))
    DLPack capsule 'dltensor' (unversioned) from libtorch_python.so
      data 0x55d0...  device CPU:0  dtype int64 (code 0, 64 bits, 1 lane)  ndim 2
      shape (2, 3)  strides (3, 1) elements  byte_offset 0
      deleter libtorch_cpu.so+0x... (libtorch_cpu.so)  manager_ctx 0x...
      checks: ok

For an object with ``__dlpack__`` it asks for a capsule the way a current
consumer does (``max_version=(1, 3)`` first, then without on TypeError:
rulebook R14), reads it and drops it unconsumed, so the producer's own
destructor releases the tensor (R3): nothing leaks and nothing is renamed.
A versioned capsule shows its version and flags (READ_ONLY, IS_COPIED,
IS_SUBBYTE_TYPE_PADDED); ``copy=True`` / ``copy=False`` is passed on to
``__dlpack__`` and the flags are held to it (R21, R24).

numpy's owner capsule of an imported array (``arr.base`` after
``np.from_dlpack``, named ``numpy_dltensor`` or ``numpy_dltensor_versioned``)
is read as well: it shows the tensor numpy holds, and the producer named is
the module of its deleter.
For a raw capsule it reads the struct with the capsule's current name and
never consumes it, unless ``consume=True``: then it renames the capsule to
``used_*`` and calls the deleter, as a consumer that is done would.

A consumed (``used_*``) capsule's struct belongs to its consumer, which may
already have released it: describe() does not read it.

The producing module is the object that holds the capsule's destructor;
symbols come from ``dladdr1`` and are reported only when the address is
inside the symbol (a static function shows as ``module+0xoffset``). Under
the capsan runtime, destructors and deleters of capsules it saw are its
trampolines (reported as ``wrapped by capsan``).
"""
from __future__ import annotations

import ctypes
import json
import os
from ctypes import POINTER, Structure, c_char_p, c_int, c_size_t, c_uint8, c_uint16, c_uint32
from ctypes import c_uint64, c_void_p

from . import dlpack as D

# ---------------------------------------------------------------- dladdr


class _DlInfo(Structure):
    _fields_ = [("dli_fname", c_char_p), ("dli_fbase", c_void_p), ("dli_sname", c_char_p),
                ("dli_saddr", c_void_p)]


class _Elf64Sym(Structure):
    _fields_ = [("st_name", c_uint32), ("st_info", c_uint8), ("st_other", c_uint8),
                ("st_shndx", c_uint16), ("st_value", c_uint64), ("st_size", c_uint64)]


def _libdl():
    for name in (None, "libdl.so.2"):
        try:
            lib = ctypes.CDLL(name)
            lib.dladdr1
            return lib
        except (OSError, AttributeError):
            continue
    return None


_dl = _libdl()
if _dl is not None:
    _dladdr1 = _dl.dladdr1
    _dladdr1.restype = c_int
    _dladdr1.argtypes = [c_void_p, POINTER(_DlInfo), POINTER(c_void_p), c_int]
RTLD_DL_SYMENT = 1

_demangler = None


def _demangle(name: str) -> str:
    global _demangler
    if not name.startswith("_Z"):
        return name
    if _demangler is None:
        _demangler = False
        for lib in (None, "libstdc++.so.6"):
            try:
                f = ctypes.CDLL(lib).__cxa_demangle
                f.restype = c_void_p
                f.argtypes = [c_char_p, c_void_p, POINTER(c_size_t), POINTER(c_int)]
                _demangler = f
                break
            except (OSError, AttributeError):
                continue
    if not _demangler:
        return name
    st = c_int()
    p = _demangler(name.encode(), None, None, ctypes.byref(st))
    if not p or st.value != 0:
        return name
    try:
        return ctypes.string_at(p).decode("utf-8", "replace")
    finally:
        ctypes.CDLL(None).free(c_void_p(p))


def symbolize(addr: int) -> dict:
    """{'address', 'module', 'path', 'symbol', 'offset'} of a code address:
    symbol is the demangled name only when addr lies inside that symbol,
    else None (and offset is from the module's base)."""
    out = {"address": addr, "module": None, "path": None, "symbol": None, "offset": None}
    if not addr or _dl is None:
        return out
    own = _OWN.get(addr)
    if own:  # capsan.dlpack's ctypes callbacks (behind their guards)
        out.update(module="capsan.dlpack", symbol=own, offset=0)
        return out
    info, sym = _DlInfo(), c_void_p()
    if not _dladdr1(addr, ctypes.byref(info), ctypes.byref(sym), RTLD_DL_SYMENT):
        return out
    path = info.dli_fname.decode("utf-8", "replace") if info.dli_fname else None
    if path:
        out["path"] = os.path.realpath(path) if os.path.exists(path) else path
        out["module"] = os.path.basename(path)
    base = info.dli_fbase or 0
    out["offset"] = addr - base
    if info.dli_sname and info.dli_saddr and sym.value:
        s = _Elf64Sym.from_address(sym.value)
        start = info.dli_saddr
        if start <= addr < start + max(s.st_size, 1):
            out["symbol"] = _demangle(info.dli_sname.decode("utf-8", "replace"))
            out["offset"] = addr - start
    return out


_OWN = {D._DELETER_ADDR: "capsan.dlpack deleter (Python, ctypes)",
        D._DESTRUCTOR_ADDR: "capsan.dlpack capsule destructor (Python, ctypes)"}


def _where(s: dict) -> str:
    if s["symbol"]:
        name = s["symbol"]
        if s["offset"]:
            name += f"+{s['offset']:#x}"
        return f"{name} ({s['module']})"
    if s["module"]:
        return f"{s['module']}+{s['offset']:#x} ({s['module']})"
    return f"{s['address']:#x} (no module)" if s["address"] else "NULL"


def _original(kind: str, arg: int) -> int:
    """The function capsan's trampoline stands for, if the runtime can say
    (capsan_original_destructor(capsule) / capsan_original_deleter(struct))."""
    try:
        from .allocator import libcapsan
        lib = libcapsan()
        f = getattr(lib, f"capsan_original_{kind}", None) if lib is not None else None
    except Exception:  # noqa: BLE001
        f = None
    if f is None:
        return 0
    f.restype, f.argtypes = c_void_p, [c_void_p]
    return f(arg) or 0


def _is_capsan(s: dict) -> bool:
    return bool(s.get("module") and s["module"].startswith("libcapsan"))


# ---------------------------------------------------------------- checks

OK, WARN, FAIL, NA = "ok", "warn", "fail", "n/a"
_RANK = {NA: 0, OK: 0, WARN: 1, FAIL: 2}


def _plausible(p) -> bool:
    return bool(p) and 4096 <= p < 0x800000000000


class _IoVec(Structure):
    _fields_ = [("base", c_void_p), ("len", c_size_t)]


_libc = ctypes.CDLL(None, use_errno=True)
_vm_readv = getattr(_libc, "process_vm_readv", None)
if _vm_readv is not None:
    _vm_readv.restype = ctypes.c_ssize_t
    _vm_readv.argtypes = [c_int, POINTER(_IoVec), ctypes.c_ulong, POINTER(_IoVec),
                          ctypes.c_ulong, ctypes.c_ulong]


def _readable(p, n: int) -> bool:
    """The n bytes at p can be read: the kernel says so (process_vm_readv
    fails where a load would fault), so a garbage pointer in a capsule
    cannot crash describe()."""
    if not _plausible(p) or n <= 0:
        return False
    if _vm_readv is None:
        return True
    buf = ctypes.create_string_buffer(n)
    local, remote = _IoVec(ctypes.addressof(buf), n), _IoVec(p, n)
    return _vm_readv(os.getpid(), ctypes.byref(local), 1, ctypes.byref(remote), 1, 0) == n


class Description:
    """The result of describe(): ``.text`` (pretty), ``.as_dict()``,
    ``.to_json()``, ``.checks`` ([{'rule', 'verdict', 'message'}]) and
    ``.verdict`` ('ok', 'warn' or 'fail', the worst check)."""

    def __init__(self, d: dict):
        self._d = d
        self.checks = d["checks"]
        self.verdict = d["verdict"]
        self.text = _render(d)

    def as_dict(self) -> dict:
        return json.loads(json.dumps(self._d))

    def to_json(self, **kw) -> str:
        return json.dumps(self._d, **kw)

    def check(self, rule: str) -> dict | None:
        for c in self.checks:
            if c["rule"] == rule:
                return c
        return None

    def __getitem__(self, k):
        return self._d[k]

    def __str__(self):
        return self.text

    def __repr__(self):
        return f"<capsan.Description {self._d['capsule']['name']!r} verdict={self.verdict}>"


def _check_tensor(d: dict, add) -> None:
    t = d["tensor"]
    versioned = d["capsule"]["versioned"]
    ver = d.get("version")
    # R15 shape
    nd = t["ndim"]
    if nd < 0 or nd > 64:
        add("R15", FAIL, f"ndim {nd} out of range")
    elif nd > 0 and d.get("shape_unreadable"):
        add("R15", FAIL, f"shape {d['shape_unreadable']:#x} does not point to readable memory")
    elif nd > 0 and t["shape"] is None:
        add("R15", FAIL, f"shape is NULL with ndim {nd}")
    elif t["shape"] and any(s < 0 for s in t["shape"]):
        add("R15", FAIL, f"negative extent in shape {t['shape']}")
    elif nd > 32:
        add("R15", WARN, f"ndim {nd}: numpy 1.x accepts at most 32")
    else:
        add("R15", OK, "")
    # R16 strides
    if nd > 0 and t["strides"] is None:
        if versioned and ver and tuple(ver) >= (1, 2):
            add("R16", FAIL, f"strides NULL with ndim {nd} in a version "
                f"{ver[0]}.{ver[1]} struct (non-NULL from 1.2 on)")
        else:
            add("R16", OK, "strides NULL: compact row-major (allowed up to DLPack 1.1)")
    else:
        add("R16", OK, "")
    # R17 data, byte_offset
    n = d["elements"]
    if t["data"] == 0 and n:
        add("R17", FAIL, f"data is NULL with {n} elements")
    elif t["byte_offset"]:
        add("R17", WARN, f"byte_offset {t['byte_offset']}: torch before 2.13 ignores it and "
            f"reads from data")
    else:
        add("R17", OK, "" if not t["data"] else f"data {d['alignment']}-byte aligned "
            f"(256 is advisory)")
    # R18 dtype
    code, bits, lanes = t["code"], t["bits"], t["lanes"]
    if code not in D.DTYPE_CODE_NAMES:
        add("R18", FAIL, f"unknown dtype code {code}")
    elif code == D.kDLBool and bits != 8:
        add("R18", FAIL, f"bool with {bits} bits (must be 8)")
    elif code in D.FIXED_BITS and bits != D.FIXED_BITS[code]:
        add("R18", FAIL, f"{D.DTYPE_CODE_NAMES[code]} with {bits} bits "
            f"(must be {D.FIXED_BITS[code]})")
    elif code not in D.FIXED_BITS and (bits == 0 or bits % 8):
        add("R18", FAIL, f"{bits} bits is not a multiple of 8")
    elif lanes < 1:
        add("R18", FAIL, "lanes is 0")
    elif lanes != 1:
        add("R18", WARN, f"{lanes} lanes: most consumers take only 1")
    else:
        add("R18", OK, "")
    # R19 device
    dt, di = t["device_type"], t["device_id"]
    if dt not in D.DEVICE_NAMES:
        add("R19", FAIL, f"unknown device type {dt}")
    elif dt in D.HOST_DEVICES and di != 0:
        add("R19", FAIL, f"device_id {di} for {D.device_name(dt)} memory (must be 0)")
    else:
        add("R19", OK, "")
    # R20: needs the export-time snapshot
    add("R20", NA, "immutability is checked by the capsan runtime between export and release")
    # R21 flags
    if versioned:
        f = d["flags"]
        if f & ~D.KNOWN_FLAGS:
            add("R21", WARN, f"unknown flag bits {f & ~D.KNOWN_FLAGS:#x}")
        elif f & D.IS_SUBBYTE_TYPE_PADDED and not (code in D.FIXED_BITS and bits < 8):
            add("R21", WARN, "IS_SUBBYTE_TYPE_PADDED on a dtype that is not sub-byte")
        else:
            add("R21", OK, "")
    else:
        add("R21", NA, "legacy struct: no flags (cannot say read-only)")


def _read(cap, d: dict, add) -> None:
    """Fill d from the capsule; checks R1, R3, R10, R13 and the tensor ones."""
    v = D.read_capsule(cap)
    dtor = symbolize(v.destructor)
    c = d["capsule"]
    c.update({"name": v.name, "versioned": v.versioned, "consumed": v.consumed,
              "address": id(cap), "pointer": v.pointer, "destructor": dtor,
              "context": D.capsule_context(cap)})
    if _is_capsan(dtor):
        # the runtime swapped the destructor for its trampoline; ask it for
        # the original where it can tell (capsan_original_destructor)
        orig = _original("destructor", id(cap))
        d["wrapped_by_capsan"] = True
        if orig:
            dtor = symbolize(orig)
            dtor["wrapped_by_capsan"] = True
            c["destructor"] = dtor
    d["producer"] = None if _is_capsan(dtor) else dtor["module"]
    if v.owner:
        # numpy's capsule of an imported array: numpy is the consumer, the
        # deleter names the producer (below)
        c["owner"] = dtor["module"]
        d["producer"] = None
    elif v.name not in (D.CAPSULE_NAME, D.VERSIONED_CAPSULE_NAME, D.USED_CAPSULE_NAME,
                        D.USED_VERSIONED_CAPSULE_NAME):
        add("R1", FAIL, f"capsule name {v.name!r} is not a DLPack name")
        return
    if v.consumed:
        add("R1", OK, "consumed: the consumer owns the tensor; its struct is not read")
        return
    if not v.pointer:
        add("R1", FAIL, "the capsule holds NULL")
        return
    size = ctypes.sizeof(D.DLManagedTensorVersioned if v.versioned else D.DLManagedTensor)
    if not _readable(v.pointer, size):
        add("R1", FAIL, f"the capsule's pointer {v.pointer:#x} does not point to readable memory")
        return
    if v.owner:
        add("R1", OK, "numpy's owner capsule of an imported array: the tensor is on loan to "
            "numpy until the array dies")
    else:
        add("R1", OK, "")
        add("R3", OK if v.destructor else WARN,
            "" if v.destructor else "no destructor: the tensor leaks unless someone consumes it")
    m = v.managed
    d["manager_ctx"] = m.manager_ctx or 0
    deleter = ctypes.cast(m.deleter, c_void_p).value or 0
    dsym = symbolize(deleter)
    if _is_capsan(dsym):
        d["wrapped_by_capsan"] = True
        orig = _original("deleter", v.pointer)
        if orig:
            dsym = symbolize(orig)
            dsym["wrapped_by_capsan"] = True
    d["deleter"] = dsym
    if d["producer"] is None and dsym["module"] and (not v.destructor or v.owner) \
            and not _is_capsan(dsym):
        d["producer"] = dsym["module"]
    add("R10", OK if deleter else WARN,
        "" if deleter else "deleter is NULL: the data must be immortal")
    if v.versioned:
        d["version"] = [m.version.major, m.version.minor]
        d["flags"] = m.flags
        d["flag_names"] = D.flag_names(m.flags)
        if m.version.major == 0:
            add("R13", FAIL, "major version 0 in a 'dltensor_versioned' capsule")
            return
        if m.version.major != D.DLPACK_MAJOR_VERSION:
            add("R13", FAIL, f"major version {m.version.major}: only deleter and manager_ctx "
                f"may be read")
            return
        add("R13", OK, "" if m.version.minor <= D.DLPACK_MINOR_VERSION else
            f"minor {m.version.minor} is newer than {D.DLPACK_MINOR_VERSION}: "
            f"fields up to flags are ABI-frozen")
    else:
        add("R13", NA, "legacy struct: no version")
    t = m.dl_tensor
    nd = t.ndim
    shape_p = ctypes.cast(t.shape, c_void_p).value
    strides_p = ctypes.cast(t.strides, c_void_p).value
    ok_nd = 0 <= nd <= 64
    tf = {"data": t.data or 0, "device_type": t.device.device_type,
          "device_id": t.device.device_id, "ndim": nd, "code": t.dtype.code,
          "bits": t.dtype.bits, "lanes": t.dtype.lanes, "byte_offset": t.byte_offset,
          "shape": tuple(t.shape[i] for i in range(nd)) if ok_nd and _readable(shape_p, 8 * nd)
          else (() if nd == 0 and _plausible(shape_p) else None),
          "strides": tuple(t.strides[i] for i in range(nd))
          if ok_nd and _readable(strides_p, 8 * nd) else None}
    if ok_nd and nd > 0 and shape_p and tf["shape"] is None:
        d["shape_unreadable"] = shape_p
    d["tensor"] = tf
    n = 1
    for s in tf["shape"] or ():
        n *= max(s, 0)
    d["elements"] = n if tf["shape"] is not None or nd == 0 else None
    d["nbytes"] = (n * tf["bits"] * tf["lanes"] + 7) // 8 if d["elements"] is not None else None
    first = tf["data"] + tf["byte_offset"]
    d["alignment"] = (first & -first) if first else 0
    if d["alignment"] > 4096:
        d["alignment"] = 4096
    _check_tensor(d, add)


def describe(obj, consume: bool = False, *, max_version="auto", copy=None,
             arrow=None) -> Description:
    """Describe a DLPack capsule, or the capsule an object's ``__dlpack__`` makes.

    consume      -- raw capsule only: after reading, consume it as a consumer
                    that is done would (rename to used_*, call the deleter).
                    Default False: the capsule is left exactly as it was.
    max_version  -- objects: "auto" asks for (1, 3) and retries without on
                    TypeError (R14); None asks for a legacy capsule; a tuple
                    asks for that.
    arrow        -- True: describe an object's Arrow PyCapsule dunders even when it
                    has __dlpack__ too (None: Arrow for Arrow capsules and for
                    objects with the Arrow dunders and no __dlpack__)
    copy         -- objects: passed to ``__dlpack__(copy=...)`` when not None;
                    a versioned answer must then say IS_COPIED exactly when
                    copy is True (R21, R24)
    """
    d = {"source": None, "object_type": None, "capsule": {}, "producer": None,
         "wrapped_by_capsan": False, "version": None, "flags": None, "flag_names": None,
         "tensor": None, "elements": None, "nbytes": None, "alignment": None,
         "manager_ctx": None, "deleter": None, "requested_max_version": None,
         "dlpack_device": None, "consumed_by_describe": False, "producer_hint": None,
         "requested_copy": None, "checks": [], "verdict": OK}

    def add(rule, verdict, message):
        d["checks"].append({"rule": rule, "verdict": verdict, "message": message})

    from . import arrowdesc as A
    if isinstance(obj, int) and not isinstance(obj, bool):
        # an address: the Arrow struct capsan follows there (R49)
        ad = A.describe_address(obj, symbolize, _readable)
        if ad["followed"]:
            return Description(ad)
    if not isinstance(obj, type) and (A.is_arrow(obj) if arrow is None else arrow):
        return Description(A.describe_arrow(obj, symbolize, _original, _is_capsan, _readable))
    from . import exchange as X
    tp = obj if isinstance(obj, type) else type(obj)
    xt = X.table_of(tp) if type(obj).__name__ != "PyCapsule" else None
    if xt:
        d["exchange_api"] = X.table_info(xt, symbolize)
    if isinstance(obj, type):
        if not xt:
            raise TypeError(f"describe() of a type takes one with a DLPack exchange table "
                            f"({X.CAPSULE_ATTR}), not {obj!r}")
        d["source"] = "type"
        d["object_type"] = f"{obj.__module__}.{obj.__qualname__}"
        d["verdict"] = OK
        return Description(d)
    if type(obj).__name__ == "PyCapsule":
        d["source"] = "capsule"
        _read(obj, d, add)
        if consume:
            _consume(obj, d)
    elif hasattr(type(obj), "__dlpack__") or hasattr(obj, "__dlpack__"):
        d["source"] = "object"
        t = type(obj)
        d["object_type"] = f"{t.__module__}.{t.__qualname__}"
        # a pyarrow Array speaks both: say that the other view exists
        d["also_arrow"] = A.arrow_dunders(t) if arrow is None else []
        cap, asked = _get_capsule(obj, max_version, copy)
        d["requested_max_version"] = list(asked) if asked else None
        d["requested_copy"] = copy
        try:
            _read(cap, d, add)
            if d["producer"] is None:
                d["producer_hint"] = t.__module__.split(".")[0]
            got = d["version"]
            if d["capsule"]["consumed"]:
                add("R25", FAIL, "__dlpack__ returned a capsule that is already consumed")
            elif asked is None and d["capsule"]["versioned"]:
                add("R14", FAIL, "a versioned capsule for a request without max_version")
            elif asked is not None and got and got[0] > asked[0]:
                add("R14", FAIL, f"major version {got[0]} above the requested {asked[0]}")
            else:
                add("R14", OK, "" if asked else "producer does not take max_version: legacy")
            if copy is not None and d["flags"] is not None:
                copied = bool(d["flags"] & D.IS_COPIED)
                if copied == bool(copy):
                    add("R24", OK, "")
                else:
                    add("R24", FAIL, "__dlpack__(copy=True) answered without IS_COPIED (a copy "
                        "must say so)" if copy else
                        "__dlpack__(copy=False) answered with IS_COPIED (it must never copy)")
            if hasattr(obj, "__dlpack_device__") and d["tensor"]:
                dev = tuple(obj.__dlpack_device__())
                d["dlpack_device"] = list(dev)
                tdev = (d["tensor"]["device_type"], d["tensor"]["device_id"])
                add("R22", OK if tuple(int(x) for x in dev) == tdev else FAIL,
                    "" if tuple(int(x) for x in dev) == tdev else
                    f"__dlpack_device__ {dev} but the capsule says {tdev}")
            if consume:
                _consume(cap, d)
        finally:
            # unconsumed: the producer's destructor releases it now (R3)
            del cap
    else:
        raise TypeError(f"describe() takes a DLPack capsule or an object with __dlpack__ (or an "
                        f"Arrow capsule or an object with __arrow_c_array__, __arrow_c_schema__ "
                        f"or __arrow_c_stream__, or a type with a DLPack exchange table, or "
                        f"the address of an Arrow struct capsan follows), "
                        f"not {type(obj).__name__}")
    d["verdict"] = max((c["verdict"] for c in d["checks"]), key=_RANK.get, default=OK)
    if d["verdict"] == NA:
        d["verdict"] = OK
    return Description(d)


def _get_capsule(obj, max_version, copy=None):
    kw = {} if copy is None else {"copy": bool(copy)}
    if max_version == "auto":
        try:
            return obj.__dlpack__(max_version=D.DLPACK_VERSION, **kw), D.DLPACK_VERSION
        except TypeError:
            if kw:
                raise
            return obj.__dlpack__(), None
    if max_version is None:
        return obj.__dlpack__(**kw), None
    return obj.__dlpack__(max_version=tuple(max_version), **kw), tuple(max_version)


class _Once:
    """Hands one capsule to np.from_dlpack (which wants __dlpack__)."""

    def __init__(self, cap):
        self.cap = cap

    def __dlpack__(self, stream=None):
        cap, self.cap = self.cap, None
        return cap

    def __dlpack_device__(self):
        return (D.kDLCPU, 0)


def _consume(cap, d):
    """Consume as a consumer that is done with the tensor: rename, then release.

    Through numpy when it can import the tensor (unversioned CPU ones):
    then the rename and the deleter call are numpy's, made through the
    calls the capsan runtime watches. Otherwise directly (PyCapsule_SetName,
    then the deleter), through ctypes, which the runtime does not see."""
    name = d["capsule"].get("name")
    if name not in (D.CAPSULE_NAME, D.VERSIONED_CAPSULE_NAME):
        return
    if name == D.CAPSULE_NAME and d.get("tensor") and d["tensor"]["device_type"] == D.kDLCPU:
        import sys
        np = sys.modules.get("numpy")
        if np is not None:
            try:
                arr = np.from_dlpack(_Once(cap))
            except Exception:  # noqa: BLE001 - numpy refused and left it unconsumed (R8)
                arr = None
            if arr is not None or D.capsule_name(cap) != D.CAPSULE_NAME:
                del arr  # numpy's own capsule calls the deleter now
                d["consumed_by_describe"] = "numpy"
                return
    used = D.USED_VERSIONED_CAPSULE_NAME if name == D.VERSIONED_CAPSULE_NAME \
        else D.USED_CAPSULE_NAME
    ptr = D.capsule_pointer(cap)
    if D._Capsule_SetName_obj(cap, D._NAME_ADDR[used]) != 0:
        raise RuntimeError("PyCapsule_SetName failed")
    d["consumed_by_describe"] = "ctypes"
    # R13: whatever the version, only the deleter is read here
    t = D.DLManagedTensorVersioned if name == D.VERSIONED_CAPSULE_NAME else D.DLManagedTensor
    deleter = t.from_address(ptr).deleter
    if deleter:
        deleter(ptr)


# ---------------------------------------------------------------- text

def _render(d: dict) -> str:
    if d.get("protocol") == "arrow":
        from .arrowdesc import render
        return render(d)
    if d["source"] == "type":
        from .exchange import render
        return "\n".join([f"{d['object_type']}: DLPack C exchange API"] +
                         render(d["exchange_api"]))
    c = d["capsule"]
    name = c.get("name")
    if c.get("versioned"):
        v = d.get("version")
        kind = f"version {v[0]}.{v[1]}" if v else "versioned"
        if d.get("flags") is not None:
            kind += f", flags {d['flags']:#x}" + (
                f" {'|'.join(d['flag_names'])}" if d["flag_names"] else "")
    else:
        kind = "unversioned"
    if c.get("consumed"):
        kind = "consumed"
    head = f"DLPack capsule {name!r} ({kind})"
    if c.get("owner"):
        head += f" held by {c['owner']} (an imported array's base)"
    if d["producer"]:
        head += f" from {d['producer']}"
    elif d.get("producer_hint"):
        head += f" from {d['producer_hint']} (its destructor is wrapped by capsan)"
    elif d["wrapped_by_capsan"]:
        head += " (its destructor is wrapped by capsan)"
    if d["object_type"]:
        args = []
        if d["requested_max_version"]:
            args.append(f"max_version={tuple(d['requested_max_version'])}")
        if d.get("requested_copy") is not None:
            args.append(f"copy={d['requested_copy']}")
        head += f"  [{d['object_type']}.__dlpack__({', '.join(args)})]"
    lines = [head]
    t = d.get("tensor")
    if t:
        lanes = t["lanes"]
        lines.append(
            f"  data {t['data']:#x}  device {D.device_name(t['device_type'])}:{t['device_id']}"
            f"  dtype {D.dtype_name(t['code'], t['bits'], lanes)} (code {t['code']}, "
            f"{t['bits']} bits, {lanes} lane{'s' if lanes != 1 else ''})  ndim {t['ndim']}")
        shape = "NULL" if t["shape"] is None else _tuple(t["shape"])
        strides = ("NULL (compact row-major)" if t["strides"] is None
                   else _tuple(t["strides"]) + " elements")
        lines.append(f"  shape {shape}  strides {strides}  byte_offset {t['byte_offset']}")
    if d.get("deleter") is not None:
        dl = d["deleter"]
        where = "NULL" if not dl["address"] else _where(dl)
        if _is_capsan(dl):
            where += " [capsan trampoline]"
        elif dl.get("wrapped_by_capsan"):
            where += " [wrapped by capsan]"
        lines.append(f"  deleter {where}  manager_ctx {d['manager_ctx']:#x}")
    if d["consumed_by_describe"]:
        lines.append(f"  consumed by describe() ({d['consumed_by_describe']}): renamed to "
                     f"used_*, deleter called")
    if d.get("exchange_api"):
        from .exchange import render
        lines += render(d["exchange_api"])
    bad = [x for x in d["checks"] if x["verdict"] in (WARN, FAIL)]
    if not bad:
        lines.append("  checks: ok")
    else:
        lines.append(f"  checks: {d['verdict']}")
        for x in bad:
            lines.append(f"    {x['rule']} {x['verdict']}: {x['message']}")
    if d.get("also_arrow"):
        lines.append(f"  also an Arrow producer ({', '.join(d['also_arrow'])}): "
                     f"describe(x, arrow=True) shows its Arrow structs")
    return "\n".join(lines)


def _tuple(t) -> str:
    return "(" + ", ".join(map(str, t)) + ("," if len(t) == 1 else "") + ")"


__all__ = ["describe", "Description", "symbolize"]
