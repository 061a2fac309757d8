"""DLPack in pure Python: the C structures as ctypes, the constants, and
helpers to build a capsule from a Python buffer or to read one.

Structures (x86-64 layouts, checked at import; rulebook §B)::

    DLDevice                  8 bytes   device_type@0 device_id@4
    DLDataType                4 bytes   code@0 bits@1 lanes@2
    DLTensor                 48 bytes   data@0 device@8 ndim@16 dtype@20 shape@24
                                        strides@32 byte_offset@40
    DLManagedTensor          64 bytes   dl_tensor@0 manager_ctx@48 deleter@56
    DLPackVersion             8 bytes   major@0 minor@4
    DLManagedTensorVersioned 80 bytes   version@0 manager_ctx@8 deleter@16 flags@24
                                        dl_tensor@32

Building a capsule (the producer side)::

    cap = dlpack.to_capsule(np.arange(6.0).reshape(2, 3))   # any buffer-protocol object
    t = torch.from_dlpack(cap)                              # torch accepts a raw capsule
    a = np.from_dlpack(dlpack.Exporter(buf))                # numpy wants __dlpack__

The memory stays owned by the Python object: the export holds a buffer view
of it (so a bytearray cannot be resized under the tensor) and a reference,
both given back by the deleter, which runs exactly once: called by the
consumer after a rename to ``used_dltensor``, or by the capsule's destructor
when the capsule dies unconsumed (rulebook R3). The deleter and the
destructor are ctypes callbacks that stay referenced for the life of the
process; they take the GIL themselves (a consumer such as torch 1.13 calls
foreign deleters without it, R12).

Reading a capsule (``read_capsule``) never consumes or renames it: it takes
the pointer with the capsule's current name.
"""
from __future__ import annotations

import ctypes
import struct as _struct
import sys
import threading
from ctypes import (CFUNCTYPE, POINTER, Structure, c_char_p, c_int, c_int32, c_int64,
                    c_size_t, c_ssize_t, c_uint8, c_uint16, c_uint32, c_uint64, c_void_p,
                    py_object, sizeof)

from . import _guard

# ---------------------------------------------------------------- constants

#: The newest DLPack version whose structures and enums this module knows.
DLPACK_MAJOR_VERSION = 1
DLPACK_MINOR_VERSION = 3
DLPACK_VERSION = (DLPACK_MAJOR_VERSION, DLPACK_MINOR_VERSION)

# DLDeviceType
kDLCPU = 1
kDLCUDA = 2
kDLCUDAHost = 3
kDLOpenCL = 4
kDLVulkan = 7
kDLMetal = 8
kDLVPI = 9
kDLROCM = 10
kDLROCMHost = 11
kDLExtDev = 12
kDLCUDAManaged = 13
kDLOneAPI = 14
kDLWebGPU = 15
kDLHexagon = 16
kDLMAIA = 17
kDLTrn = 18

DEVICE_NAMES = {
    kDLCPU: "CPU", kDLCUDA: "CUDA", kDLCUDAHost: "CUDAHost", kDLOpenCL: "OpenCL",
    kDLVulkan: "Vulkan", kDLMetal: "Metal", kDLVPI: "VPI", kDLROCM: "ROCM",
    kDLROCMHost: "ROCMHost", kDLExtDev: "ExtDev", kDLCUDAManaged: "CUDAManaged",
    kDLOneAPI: "OneAPI", kDLWebGPU: "WebGPU", kDLHexagon: "Hexagon", kDLMAIA: "MAIA",
    kDLTrn: "Trn",
}
#: Devices whose memory is host-addressable and whose device_id must be 0 (R19).
HOST_DEVICES = frozenset({kDLCPU, kDLCUDAHost, kDLROCMHost, kDLCUDAManaged})

# DLDataTypeCode
kDLInt = 0
kDLUInt = 1
kDLFloat = 2
kDLOpaqueHandle = 3
kDLBfloat = 4
kDLComplex = 5
kDLBool = 6
kDLFloat8_e3m4 = 7
kDLFloat8_e4m3 = 8
kDLFloat8_e4m3b11fnuz = 9
kDLFloat8_e4m3fn = 10
kDLFloat8_e4m3fnuz = 11
kDLFloat8_e5m2 = 12
kDLFloat8_e5m2fnuz = 13
kDLFloat8_e8m0fnu = 14
kDLFloat6_e2m3fn = 15
kDLFloat6_e3m2fn = 16
kDLFloat4_e2m1fn = 17

DTYPE_CODE_NAMES = {
    kDLInt: "int", kDLUInt: "uint", kDLFloat: "float", kDLOpaqueHandle: "opaque",
    kDLBfloat: "bfloat", kDLComplex: "complex", kDLBool: "bool",
    kDLFloat8_e3m4: "float8_e3m4", kDLFloat8_e4m3: "float8_e4m3",
    kDLFloat8_e4m3b11fnuz: "float8_e4m3b11fnuz", kDLFloat8_e4m3fn: "float8_e4m3fn",
    kDLFloat8_e4m3fnuz: "float8_e4m3fnuz", kDLFloat8_e5m2: "float8_e5m2",
    kDLFloat8_e5m2fnuz: "float8_e5m2fnuz", kDLFloat8_e8m0fnu: "float8_e8m0fnu",
    kDLFloat6_e2m3fn: "float6_e2m3fn", kDLFloat6_e3m2fn: "float6_e3m2fn",
    kDLFloat4_e2m1fn: "float4_e2m1fn",
}
#: Codes whose width is part of the name: the bits field must be exactly this (R18).
FIXED_BITS = {c: 8 for c in range(kDLFloat8_e3m4, kDLFloat8_e8m0fnu + 1)}
FIXED_BITS.update({kDLFloat6_e2m3fn: 6, kDLFloat6_e3m2fn: 6, kDLFloat4_e2m1fn: 4})

# DLManagedTensorVersioned.flags
DLPACK_FLAG_BITMASK_READ_ONLY = 1 << 0
DLPACK_FLAG_BITMASK_IS_COPIED = 1 << 1
DLPACK_FLAG_BITMASK_IS_SUBBYTE_TYPE_PADDED = 1 << 2
READ_ONLY = DLPACK_FLAG_BITMASK_READ_ONLY
IS_COPIED = DLPACK_FLAG_BITMASK_IS_COPIED
IS_SUBBYTE_TYPE_PADDED = DLPACK_FLAG_BITMASK_IS_SUBBYTE_TYPE_PADDED
FLAG_NAMES = {READ_ONLY: "READ_ONLY", IS_COPIED: "IS_COPIED",
              IS_SUBBYTE_TYPE_PADDED: "IS_SUBBYTE_TYPE_PADDED"}
KNOWN_FLAGS = READ_ONLY | IS_COPIED | IS_SUBBYTE_TYPE_PADDED

# capsule names (rulebook R1)
CAPSULE_NAME = "dltensor"
USED_CAPSULE_NAME = "used_dltensor"
VERSIONED_CAPSULE_NAME = "dltensor_versioned"
USED_VERSIONED_CAPSULE_NAME = "used_dltensor_versioned"
# numpy's own capsule holding a tensor it imported (the base of the array
# np.from_dlpack made): alive as long as the array, it calls the deleter
OWNER_CAPSULE_NAMES = ("numpy_dltensor", "numpy_dltensor_versioned")

# ---------------------------------------------------------------- structures


class DLDevice(Structure):
    _fields_ = [("device_type", c_int32), ("device_id", c_int32)]

    def __repr__(self):
        return f"DLDevice({device_name(self.device_type)}:{self.device_id})"


class DLDataType(Structure):
    _fields_ = [("code", c_uint8), ("bits", c_uint8), ("lanes", c_uint16)]

    def __repr__(self):
        return f"DLDataType({dtype_name(self.code, self.bits, self.lanes)})"


class DLTensor(Structure):
    _fields_ = [
        ("data", c_void_p),
        ("device", DLDevice),
        ("ndim", c_int32),
        ("dtype", DLDataType),
        ("shape", POINTER(c_int64)),
        ("strides", POINTER(c_int64)),
        ("byte_offset", c_uint64),
    ]


#: void (*deleter)(DLManagedTensor *self) / (DLManagedTensorVersioned *self);
#: the argument is a plain pointer so one type serves both structures.
DLPackDeleter = CFUNCTYPE(None, c_void_p)


class DLManagedTensor(Structure):
    _fields_ = [("dl_tensor", DLTensor), ("manager_ctx", c_void_p), ("deleter", DLPackDeleter)]


class DLPackVersion(Structure):
    _fields_ = [("major", c_uint32), ("minor", c_uint32)]

    def __repr__(self):
        return f"DLPackVersion({self.major}.{self.minor})"


class DLManagedTensorVersioned(Structure):
    _fields_ = [
        ("version", DLPackVersion),
        ("manager_ctx", c_void_p),
        ("deleter", DLPackDeleter),
        ("flags", c_uint64),
        ("dl_tensor", DLTensor),
    ]


def _check_layout():
    sizes = {DLDevice: 8, DLDataType: 4, DLTensor: 48, DLManagedTensor: 64,
             DLPackVersion: 8, DLManagedTensorVersioned: 80}
    for t, n in sizes.items():
        assert sizeof(t) == n, f"{t.__name__} is {sizeof(t)} bytes, expected {n}"
    offs = {(DLTensor, "data"): 0, (DLTensor, "device"): 8, (DLTensor, "ndim"): 16,
            (DLTensor, "dtype"): 20, (DLTensor, "shape"): 24, (DLTensor, "strides"): 32,
            (DLTensor, "byte_offset"): 40, (DLManagedTensor, "manager_ctx"): 48,
            (DLManagedTensor, "deleter"): 56, (DLManagedTensorVersioned, "manager_ctx"): 8,
            (DLManagedTensorVersioned, "deleter"): 16, (DLManagedTensorVersioned, "flags"): 24,
            (DLManagedTensorVersioned, "dl_tensor"): 32}
    for (t, f), off in offs.items():
        assert getattr(t, f).offset == off, f"{t.__name__}.{f} at {getattr(t, f).offset}"


_check_layout()

# ---------------------------------------------------------------- names


def device_name(device_type: int) -> str:
    return DEVICE_NAMES.get(device_type, f"device{device_type}")


def dtype_name(code: int, bits: int, lanes: int = 1) -> str:
    """'int64', 'float32', 'bool', 'bfloat16', 'float8_e4m3fn', 'float32x4' (lanes)..."""
    base = DTYPE_CODE_NAMES.get(code)
    if base is None:
        base = f"code{code}_{bits}"
    elif code in FIXED_BITS or code == kDLBool:
        pass
    else:
        base = f"{base}{bits}"
    return base if lanes == 1 else f"{base}x{lanes}"


def flag_names(flags: int) -> list[str]:
    out = [n for bit, n in FLAG_NAMES.items() if flags & bit]
    unknown = flags & ~KNOWN_FLAGS
    if unknown:
        out.append(hex(unknown))
    return out


# struct-module format -> (code, bits); native byte order only (R18)
_FORMATS = {
    "b": (kDLInt, 8), "B": (kDLUInt, 8), "h": (kDLInt, 16), "H": (kDLUInt, 16),
    "i": (kDLInt, 32), "I": (kDLUInt, 32), "l": (kDLInt, 64), "L": (kDLUInt, 64),
    "q": (kDLInt, 64), "Q": (kDLUInt, 64), "n": (kDLInt, 64), "N": (kDLUInt, 64),
    "e": (kDLFloat, 16), "f": (kDLFloat, 32), "d": (kDLFloat, 64),
    "Zf": (kDLComplex, 64), "Zd": (kDLComplex, 128), "?": (kDLBool, 8),
    "c": (kDLUInt, 8),
}


def dtype_from_format(fmt: str) -> DLDataType:
    """DLDataType of a buffer-protocol format string ('<f8', 'd', '=i'...)."""
    f = fmt or "B"
    if f[0] in "@=":
        f = f[1:]
    elif f[0] in "<>!":
        if (f[0] == "<") != (sys.byteorder == "little"):
            raise BufferError(f"DLPack carries native byte order only, got format {fmt!r}")
        f = f[1:]
    if f not in _FORMATS:
        raise BufferError(f"no DLPack dtype for buffer format {fmt!r}")
    code, bits = _FORMATS[f]
    if f in ("l", "L") and _struct.calcsize("l") == 4:
        bits = 32
    return DLDataType(code, bits, 1)


def as_dtype(dtype) -> DLDataType:
    """A DLDataType from a DLDataType, a (code, bits[, lanes]) tuple, a numpy or
    torch dtype (anything with .itemsize/.kind or str() like 'float32')."""
    if isinstance(dtype, DLDataType):
        return dtype
    if isinstance(dtype, tuple):
        return DLDataType(*dtype) if len(dtype) == 3 else DLDataType(dtype[0], dtype[1], 1)
    s = str(dtype).replace("torch.", "")
    for code, base in ((kDLUInt, "uint"), (kDLInt, "int"), (kDLBfloat, "bfloat"),
                       (kDLComplex, "complex"), (kDLFloat, "float")):
        if s.startswith(base) and s[len(base):].isdigit():
            return DLDataType(code, int(s[len(base):]), 1)
    if s in ("bool", "bool_"):
        return DLDataType(kDLBool, 8, 1)
    raise TypeError(f"cannot map {dtype!r} to a DLDataType")


# ---------------------------------------------------------------- the C API we call

# Our own handle, so argtypes set here never change ctypes.pythonapi's.
_py = ctypes.PyDLL(None)


def _fn(name, restype, *argtypes):
    f = getattr(_py, name)
    f.restype = restype
    f.argtypes = list(argtypes)
    return f


PyCapsule_Destructor = CFUNCTYPE(None, c_void_p)  # gets the dying capsule: never a py_object

_Capsule_New = _fn("PyCapsule_New", py_object, c_void_p, c_void_p, c_void_p)
_Capsule_GetName_obj = _fn("PyCapsule_GetName", c_void_p, py_object)
_Capsule_GetPointer_obj = _fn("PyCapsule_GetPointer", c_void_p, py_object, c_void_p)
_Capsule_IsValid_obj = _fn("PyCapsule_IsValid", c_int, py_object, c_char_p)
_Capsule_GetDestructor_obj = _fn("PyCapsule_GetDestructor", c_void_p, py_object)
_Capsule_GetContext_obj = _fn("PyCapsule_GetContext", c_void_p, py_object)
_Capsule_SetName_obj = _fn("PyCapsule_SetName", c_int, py_object, c_void_p)
# the same calls on a raw PyObject* (inside a destructor the capsule is dying:
# a py_object argument would resurrect it, R4)
_py_raw = ctypes.PyDLL(None)
_Capsule_GetName_raw = getattr(_py_raw, "PyCapsule_GetName")
_Capsule_GetName_raw.restype, _Capsule_GetName_raw.argtypes = c_void_p, [c_void_p]
_Capsule_GetPointer_raw = getattr(_py_raw, "PyCapsule_GetPointer")
_Capsule_GetPointer_raw.restype, _Capsule_GetPointer_raw.argtypes = c_void_p, [c_void_p, c_void_p]


class Py_buffer(Structure):
    _fields_ = [("buf", c_void_p), ("obj", c_void_p), ("len", c_ssize_t),
                ("itemsize", c_ssize_t), ("readonly", c_int), ("ndim", c_int),
                ("format", c_char_p), ("shape", POINTER(c_ssize_t)),
                ("strides", POINTER(c_ssize_t)), ("suboffsets", POINTER(c_ssize_t)),
                ("internal", c_void_p)]


PyBUF_FORMAT = 0x0004
PyBUF_ND = 0x0008
PyBUF_STRIDES = 0x0010 | PyBUF_ND
PyBUF_WRITABLE = 0x0001
_GetBuffer = _fn("PyObject_GetBuffer", c_int, py_object, POINTER(Py_buffer), c_int)
_ReleaseBuffer = _fn("PyBuffer_Release", None, POINTER(Py_buffer))
_IsInitialized = _fn("Py_IsInitialized", c_int)

# Capsule names live as long as the process (R2: a name must outlive its capsule).
_NAMES = {n: ctypes.create_string_buffer(n.encode()) for n in
          (CAPSULE_NAME, USED_CAPSULE_NAME, VERSIONED_CAPSULE_NAME,
           USED_VERSIONED_CAPSULE_NAME)}
_NAME_ADDR = {n: ctypes.addressof(b) for n, b in _NAMES.items()}


def capsule_name(cap) -> str | None:
    """The capsule's current name (None for an unnamed capsule)."""
    if type(cap).__name__ != "PyCapsule":
        raise TypeError(f"not a PyCapsule: {type(cap).__name__}")
    p = _Capsule_GetName_obj(cap)
    return ctypes.string_at(p).decode("utf-8", "replace") if p else None


def capsule_pointer(cap) -> int:
    """The capsule's pointer, read with its current name: never renames."""
    capsule_name(cap)  # type check
    from . import _lib  # the runtime reads it without recording a consume
    if _lib.has("capsan_capsule_peek"):
        return _lib.call("capsan_capsule_peek", cap) or 0
    p = _Capsule_GetName_obj(cap)  # the very char* the capsule holds
    ptr = _Capsule_GetPointer_obj(cap, p)
    return ptr or 0


def capsule_destructor(cap) -> int:
    """Address of the capsule's destructor (0 if none)."""
    return _Capsule_GetDestructor_obj(cap) or 0


def capsule_context(cap) -> int:
    return _Capsule_GetContext_obj(cap) or 0


# ---------------------------------------------------------------- reading

class CapsuleView:
    """What a DLPack capsule holds, read without consuming it.

    ``managed`` is the DLManagedTensor or DLManagedTensorVersioned laid over
    the capsule's pointer (None for a consumed capsule: after a rename to
    ``used_*`` the consumer owns the struct and may already have freed it).
    numpy's owner capsules (``numpy_dltensor*``, the base of an array that
    np.from_dlpack made) are read too: ``owner`` is True, and the struct
    lives as long as that capsule does.
    """

    def __init__(self, cap):
        self.name = capsule_name(cap)
        self.pointer = capsule_pointer(cap)
        self.destructor = capsule_destructor(cap)
        self.versioned = bool(self.name and self.name.endswith("_versioned"))
        self.consumed = bool(self.name and self.name.startswith("used_"))
        self.managed = None
        self.owner = self.name in OWNER_CAPSULE_NAMES
        if self.pointer and not self.consumed and (
                self.name in (CAPSULE_NAME, VERSIONED_CAPSULE_NAME) or self.owner):
            t = DLManagedTensorVersioned if self.versioned else DLManagedTensor
            self.managed = t.from_address(self.pointer)

    @property
    def tensor(self) -> DLTensor | None:
        return self.managed.dl_tensor if self.managed is not None else None


def read_capsule(cap) -> CapsuleView:
    """Read a DLPack capsule without consuming it (no rename, no deleter call)."""
    return CapsuleView(cap)


def tensor_fields(t: DLTensor) -> dict:
    """Plain-Python copy of a DLTensor's fields (shape/strides as tuples or None)."""
    n = t.ndim
    ok = 0 <= n <= 1024
    shape = tuple(t.shape[i] for i in range(n)) if t.shape and ok else None
    strides = tuple(t.strides[i] for i in range(n)) if t.strides and ok else None
    return {"data": t.data or 0, "device_type": t.device.device_type,
            "device_id": t.device.device_id, "ndim": n, "code": t.dtype.code,
            "bits": t.dtype.bits, "lanes": t.dtype.lanes, "shape": shape,
            "strides": strides, "byte_offset": t.byte_offset}


# ---------------------------------------------------------------- building

class _Export:
    """One outstanding pure-Python export: everything the deleter gives back."""
    __slots__ = ("managed", "shape", "strides", "view", "owner", "on_delete", "__weakref__")


_live: dict[int, _Export] = {}
_stats_lock = threading.Lock()
_stats = {"exported": 0, "deleted": 0, "unknown_deletes": 0}


def _deleter_impl(ptr, _live=_live, _stats=_stats, _release=_ReleaseBuffer,
                  _byref=ctypes.byref):
    # (module globals bound as defaults: this can run late in interpreter
    # shutdown, after the module's dict was cleared)
    # A ctypes callback behind a guard: it holds the GIL (torch 1.13 calls
    # foreign deleters without it, from any thread), a pending exception is
    # set aside, and after Py_Finalize the guard returns before Python runs.
    e = _live.pop(ptr, None)
    if e is None:
        _stats["unknown_deletes"] += 1  # a second call for the same struct
        return
    _stats["deleted"] += 1
    if e.view is not None:
        _release(_byref(e.view))
        e.view = None
    cb, e.on_delete, e.owner = e.on_delete, None, None
    if cb is not None:
        try:
            cb()
        except BaseException:  # a deleter must never raise (R5)
            pass


_deleter_cb = DLPackDeleter(_deleter_impl)
# C calls the guard in front of it (preserves a pending exception, takes the
# GIL, does nothing after Py_Finalize: see _guard.py); immortal
_DELETER_ADDR, _deleter_guard = _guard.guard(_deleter_cb)
_deleter = DLPackDeleter(_DELETER_ADDR)


def _capsule_destructor_impl(cap, _get_name=_Capsule_GetName_raw,
                             _get_pointer=_Capsule_GetPointer_raw, _string_at=ctypes.string_at,
                             _cast=ctypes.cast, _c_void_p=c_void_p, _deleter_impl=_deleter_impl,
                             _mt=DLManagedTensor, _mtv=DLManagedTensorVersioned,
                             _dl=_NAME_ADDR[CAPSULE_NAME],
                             _dlv=_NAME_ADDR[VERSIONED_CAPSULE_NAME], _own=_DELETER_ADDR):
    # The reference destructor (rulebook R3): release the tensor exactly when
    # the capsule dies unconsumed; a consumed (used_*) capsule is the
    # consumer's business. `cap` is a raw pointer: the capsule is dying.
    p = _get_name(cap)
    if not p:
        return
    if p == _dl or p == _dlv:
        versioned = p == _dlv
    else:
        name = _string_at(p)
        if name not in (b"dltensor", b"dltensor_versioned"):
            return  # used_* (or a stranger): not ours to release
        versioned = name == b"dltensor_versioned"
    mt = _get_pointer(cap, p)
    if not mt:
        return
    t = _mtv if versioned else _mt
    d = t.from_address(mt).deleter
    if _cast(d, _c_void_p).value == _own:
        _deleter_impl(mt)  # our own: no second trip through ctypes
    elif d:
        d(mt)


_destructor_cb = PyCapsule_Destructor(_capsule_destructor_impl)
_DESTRUCTOR_ADDR, _destructor_guard = _guard.guard(_destructor_cb)
#: the destructor of every capsule this module makes (a guarded ctypes callback)
capsule_destructor_callback = PyCapsule_Destructor(_DESTRUCTOR_ADDR)


def live_exports() -> int:
    """Pure-Python exports whose deleter has not run yet."""
    return len(_live)


def stats() -> dict:
    """{'exported', 'deleted', 'live', 'unknown_deletes'} for this module's exports."""
    return dict(_stats, live=len(_live))


def to_managed(obj, *, shape=None, strides=None, dtype=None, byte_offset: int = 0,
               device=(kDLCPU, 0), versioned: bool = False, version=(1, 1), flags: int = 0,
               on_delete=None) -> int:
    """Export the memory of a buffer-protocol object as a DLManagedTensor
    (or DLManagedTensorVersioned); returns the struct address.

    shape/strides (in elements) default to the buffer's; dtype (DLDataType,
    (code, bits[, lanes]), or a numpy/torch dtype) to its format. The export
    keeps a buffer view of obj until the deleter runs; ``on_delete()`` is
    called then. A read-only buffer needs ``versioned=True`` (it is then
    flagged READ_ONLY): a legacy struct cannot say read-only (R21).
    """
    view = Py_buffer()
    try:
        _GetBuffer(obj, ctypes.byref(view), PyBUF_STRIDES | PyBUF_FORMAT | PyBUF_WRITABLE)
    except (BufferError, ValueError, TypeError):
        _GetBuffer(obj, ctypes.byref(view), PyBUF_STRIDES | PyBUF_FORMAT)
    try:
        if view.readonly:
            if not versioned:
                raise BufferError("read-only memory cannot be exported through a legacy "
                                  "(unversioned) DLPack capsule (rulebook R21)")
            flags |= READ_ONLY
        dt = as_dtype(dtype) if dtype is not None else dtype_from_format(
            view.format.decode() if view.format else "B")
        itemsize = max(1, (dt.bits * dt.lanes + 7) // 8)
        if shape is None:
            bshape = [view.shape[i] for i in range(view.ndim)] if view.ndim else []
            if dtype is not None and view.itemsize != itemsize:
                if view.ndim > 1:
                    raise ValueError("pass shape= to reinterpret a multi-dimensional buffer")
                bshape = [view.len // itemsize]
            shape = bshape
        shape = [int(s) for s in shape]
        if strides is None and view.ndim and shape == [view.shape[i] for i in range(view.ndim)]:
            bstr = [view.strides[i] for i in range(view.ndim)]
            if any(s % itemsize for s in bstr):
                raise BufferError("strides that are not a multiple of the item size "
                                  "cannot be expressed in DLPack")
            strides = [s // itemsize for s in bstr]
        n = len(shape)
        e = _Export()
        e.shape = (c_int64 * max(n, 1))(*shape)
        e.strides = (c_int64 * max(n, 1))(*(strides if strides is not None else _compact(shape)))
        m = DLManagedTensorVersioned() if versioned else DLManagedTensor()
        if versioned:
            m.version = DLPackVersion(*version)
            m.flags = flags
        elif flags:
            raise ValueError("flags exist only in versioned capsules")
        t = m.dl_tensor
        t.data = view.buf
        t.device = DLDevice(*device)
        t.ndim = n
        t.dtype = dt
        t.shape = ctypes.cast(e.shape, POINTER(c_int64))
        t.strides = ctypes.cast(e.strides, POINTER(c_int64))
        t.byte_offset = byte_offset
        m.manager_ctx = None
        m.deleter = _deleter
        e.managed, e.view, e.owner, e.on_delete = m, view, obj, on_delete
        addr = ctypes.addressof(m)
        _live[addr] = e
        _stats["exported"] += 1
        m.manager_ctx = addr
        view = None
        return addr
    finally:
        if view is not None:
            _ReleaseBuffer(ctypes.byref(view))


def _compact(shape):
    out, acc = [], 1
    for s in reversed(shape):
        out.append(acc)
        acc *= max(s, 1)
    return list(reversed(out))


def to_capsule(obj, **kw):
    """A fresh, unconsumed DLPack capsule ('dltensor', or 'dltensor_versioned'
    with versioned=True) over obj's memory; see to_managed for the keywords.
    Its destructor releases the tensor if nobody consumes it."""
    versioned = kw.get("versioned", False)
    addr = to_managed(obj, **kw)
    name = VERSIONED_CAPSULE_NAME if versioned else CAPSULE_NAME
    try:
        return _Capsule_New(addr, _NAME_ADDR[name], _DESTRUCTOR_ADDR)
    except BaseException:
        _deleter_impl(addr)
        raise


class Exporter:
    """An object with ``__dlpack__`` / ``__dlpack_device__`` over a buffer, for
    consumers that will not take a raw capsule (``np.from_dlpack``).

    ``__dlpack__`` follows the version negotiation of the array API (R14):
    a legacy capsule unless the caller passes ``max_version`` with major >= 1.
    Keywords are those of :func:`to_managed` (``versioned`` is decided per call).
    """

    def __init__(self, obj, **kw):
        kw.pop("versioned", None)
        self._obj, self._kw = obj, kw
        self.device = tuple(kw.get("device", (kDLCPU, 0)))
        self.calls = []

    def __dlpack__(self, *, stream=None, max_version=None, dl_device=None, copy=None):
        if stream is not None and self.device[0] == kDLCPU:
            raise BufferError("stream must be None for CPU memory")
        if copy:
            raise BufferError("this exporter never copies")
        if dl_device is not None and tuple(dl_device) != self.device:
            raise BufferError(f"cannot export to device {dl_device}")
        versioned = max_version is not None and max_version[0] >= 1
        self.calls.append({"max_version": max_version, "versioned": versioned})
        return to_capsule(self._obj, versioned=versioned, **self._kw)

    def __dlpack_device__(self):
        return self.device


__all__ = [n for n in dir() if n.startswith(("kDL", "DL", "DLPACK_"))] + [
    "READ_ONLY", "IS_COPIED", "IS_SUBBYTE_TYPE_PADDED", "KNOWN_FLAGS", "FLAG_NAMES",
    "DEVICE_NAMES", "DTYPE_CODE_NAMES", "HOST_DEVICES", "FIXED_BITS", "CAPSULE_NAME",
    "USED_CAPSULE_NAME", "VERSIONED_CAPSULE_NAME", "USED_VERSIONED_CAPSULE_NAME",
    "OWNER_CAPSULE_NAMES",
    "PyCapsule_Destructor", "Py_buffer", "CapsuleView", "Exporter", "read_capsule",
    "capsule_name", "capsule_pointer", "capsule_destructor", "capsule_context",
    "tensor_fields", "to_managed", "to_capsule", "live_exports", "stats", "device_name",
    "dtype_name", "flag_names", "dtype_from_format", "as_dtype",
]
