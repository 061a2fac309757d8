"""Native entry guards for ctypes callbacks that C code calls at awkward moments.

A ctypes callback runs Python code as soon as C calls it. Two situations
break that, and both happen to capsule destructors, DLPack deleters and
NumPy handler functions:

* **A pending exception.** C code often releases objects on an error path
  with the exception already set (numpy's ``from_dlpack`` drops the capsule
  after setting "Unsupported dtype"; an array freed while an error unwinds
  calls its handler's ``free``). A Python function called then fails with
  ``SystemError: ... returned a result with an exception set``, ctypes reports
  it as unraisable and clears the error, the callback's work is not done
  (a leak), and the C caller returns NULL with no exception set. A
  destructor or deleter must preserve the error indicator (rulebook R5);
  numpy-allocator's C wrappers do ``PyErr_Fetch``/``PyErr_Restore`` for the
  same reason.
* **After Py_Finalize**, ``PyGILState_Ensure`` (which every ctypes callback
  calls) is fatal; a deleter must then return, leaking (R12).

Python cannot do either from inside the callback, so each guarded callback
gets a 161-byte x86-64 thunk in front of it:

    if (!Py_IsInitialized()) return 0;
    g = PyGILState_Ensure(); PyErr_Fetch(&t, &v, &tb);
    r = callback(a0, a1, a2, a3);
    PyErr_Restore(t, v, tb); PyGILState_Release(g); return r;

The thunks of one owner share a private page that is written once, then
made read+execute (never writable and executable at once) and unmapped by
``Thunks.free()`` when the owner is gone. On another architecture
``available`` is False and callbacks are used unguarded.
"""
from __future__ import annotations

import ctypes
import mmap
import platform
from ctypes import c_int, c_size_t, c_void_p

# guard.S (intel syntax), assembled with GNU as; placeholders 0x11..0x66 x8
_CODE = bytes.fromhex(
    "554889e54883ec4048897df8488975f0488955e848894de048b81111111111111111ffd085c074"
    "7548b82222222222222222ffd0488945d8488d7dd0488d75c8488d55c048b83333333333333333"
    "ffd0488b7df8488b75f0488b55e8488b4de048b84444444444444444ffd0488945f8488b7dd048"
    "8b75c8488b55c048b85555555555555555ffd08b7dd848b86666666666666666ffd0488b45f8c9"
    "c331c0c9c3")
_SLOTS = {k: _CODE.index(bytes([b]) * 8) for k, b in (
    ("initialized", 0x11), ("ensure", 0x22), ("fetch", 0x33), ("callback", 0x44),
    ("restore", 0x55), ("release", 0x66))}
_STRIDE = 176  # 161 bytes, rounded up to a multiple of 16
# drop_ctx.S: a C function without the NEP 49 ctx argument called as one with
# it: shift rsi->rdi, rdx->rsi, rcx->rdx and jump (tail call) to the target
_DROP_CTX = bytes.fromhex("4889f74889d64889ca48b87777777777777777ffe0")
_DROP_SLOT = _DROP_CTX.index(bytes([0x77]) * 8)

available = platform.machine() in ("x86_64", "AMD64") and ctypes.sizeof(c_void_p) == 8

_libc = ctypes.CDLL(None, use_errno=True)
_mmap = _libc.mmap
_mmap.restype = c_void_p
_mmap.argtypes = [c_void_p, c_size_t, c_int, c_int, c_int, ctypes.c_long]
_mprotect = _libc.mprotect
_mprotect.argtypes = [c_void_p, c_size_t, c_int]
_munmap = _libc.munmap
_munmap.argtypes = [c_void_p, c_size_t]

_PAGE = mmap.PAGESIZE
_MAP_FAILED = ctypes.c_void_p(-1).value


def _api_addr(name: str) -> int:
    return ctypes.cast(getattr(ctypes.pythonapi, name), c_void_p).value


_API = {k: _api_addr(n) for k, n in (
    ("initialized", "Py_IsInitialized"), ("ensure", "PyGILState_Ensure"),
    ("fetch", "PyErr_Fetch"), ("restore", "PyErr_Restore"),
    ("release", "PyGILState_Release"))}


class Thunks:
    """Thunks for a list of specs, each ("guard", callback_address) or
    ("drop_ctx", c_function_address): ``.addresses[i]`` is what C should call
    instead. Keep this object (and the callbacks) alive as long as C may
    call them; ``free()`` unmaps the page. Without ``available`` there are
    no thunks: a guard is the bare callback, and drop_ctx raises."""

    def __init__(self, specs):
        specs = [s if isinstance(s, tuple) else ("guard", s) for s in specs]
        self.specs = specs
        self.base = 0
        self.size = 0
        if not available or not specs:
            if any(k == "drop_ctx" for k, _ in specs):
                raise NotImplementedError("ctx-less C functions need the x86-64 thunks")
            self.addresses = [a for _, a in specs]
            return
        size = -(-len(specs) * _STRIDE // _PAGE) * _PAGE
        base = _mmap(None, size, mmap.PROT_READ | mmap.PROT_WRITE,
                     mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS, -1, 0)
        if not base or base == _MAP_FAILED:
            raise OSError(ctypes.get_errno(), "capsan: mmap for callback guards failed")
        self.addresses = []
        for i, (kind, cb) in enumerate(specs):
            if kind == "drop_ctx":
                code = bytearray(_DROP_CTX)
                code[_DROP_SLOT:_DROP_SLOT + 8] = cb.to_bytes(8, "little")
            else:
                code = bytearray(_CODE)
                for k, off in _SLOTS.items():
                    code[off:off + 8] = (cb if k == "callback" else _API[k]).to_bytes(8, "little")
            at = base + i * _STRIDE
            ctypes.memmove(at, bytes(code), len(code))
            self.addresses.append(at)
        if _mprotect(base, size, mmap.PROT_READ | mmap.PROT_EXEC) != 0:
            _munmap(base, size)
            raise OSError(ctypes.get_errno(), "capsan: mprotect for callback guards failed")
        self.base, self.size = base, size

    def free(self):
        """Unmap the thunks. Only when nothing can call them any more."""
        if self.base:
            base, self.base = self.base, 0
            _munmap(base, self.size)


def guard(callback) -> tuple[int, Thunks]:
    """(address to hand to C, owner to keep alive) for one ctypes callback."""
    t = Thunks([ctypes.cast(callback, c_void_p).value])
    return t.addresses[0], t
