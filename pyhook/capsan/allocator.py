"""NumPy data-memory handlers (NEP 49) from Python.

    h = capsan.allocator(name="mine", malloc=..., calloc=..., realloc=..., free=...)
    with capsan.using(h):
        a = np.ones(1000)                 # a's data comes from h
    capsan.handler_name(a)                # 'mine'

``allocator()`` returns a ``"mem_handler"`` capsule holding a version-1
``PyDataMem_Handler`` (168 bytes: name[127], version, then ctx, malloc,
calloc, realloc, free). Each function may be

* a **Python callable**: ``malloc(size)``, ``calloc(nelem, elsize)``,
  ``realloc(ptr, new_size)`` and ``malloc``/``calloc``/``realloc`` return an
  address (int; 0 or None for failure); ``free(ptr, size)`` (``ptr`` may be
  0 and ``size`` is a best guess: numpy 1.24 frees the block of
  ``a.resize(0)`` with size 1 and ``np.sort`` calls ``free(0, n)``, R29).
  With ``ctx`` given, it is passed as the first argument. The call takes the
  GIL (numpy may call a handler from a thread that released it), sets aside
  any exception already pending in the caller (numpy frees arrays on error
  paths) and restores it after; an exception raised by the callable is
  reported through ``sys.unraisablehook`` and the call returns NULL (numpy
  then raises ``MemoryError``) or, for ``free``, nothing (R33);
* a **C function**: a ctypes function pointer (``CFUNCTYPE`` instance or a
  ``CDLL`` function) or an integer address. With the NEP 49 signature (first
  argument ``void *ctx``) it is called directly; without ctx (libc style:
  ``malloc(size)``, ``free(ptr)``) through a 21-byte thunk that drops the
  ctx argument. Which one is read from ``argtypes`` when set, otherwise pass
  ``takes_ctx=``;
* **None**: libc's function of that name (as numpy-allocator does).

Lifetime. numpy keeps a reference to the handler capsule in every array it
allocated through it. The struct, the ctypes callbacks, their thunks and
``ctx`` are owned by a registry entry keyed by the capsule's address, which
the capsule's destructor releases, so a handler dropped by the user lives
exactly until its last array is freed: no stale handler through this API
(rulebook R28). The entry holds a reference of its own that only the
destructor drops: at interpreter exit, module teardown clears this module's
registry before numpy frees the arrays other modules' C statics keep (numpy
2 imports numpy.random lazily, and its module data is allocated through
whatever handler is current then). The 168-byte struct itself is never reused for another
handler (capsan keys what it knows about a handler by its address).

Context locality (NEP 49, rulebook R31). numpy keeps the current handler in
a ``contextvars.ContextVar``, so ``set_handler()`` and ``using()`` change it
for the *current context* only:

* a **new thread** starts on numpy's default handler, whatever the thread
  that started it had set: call ``using()`` inside the thread's function
  (unless the interpreter starts threads in a copy of their starter's
  context, ``sys.flags.thread_inherit_context``, the default of 3.14+'s
  free-threaded builds: they then start on their starter's handler);
* an **asyncio task** runs in a copy of the context current when it was
  created: tasks created inside ``with using(h):`` allocate through ``h``,
  even after the block exits in the creating task, and a ``using()`` inside
  a task changes nothing for the others;
* ``contextvars.copy_context().run(f)`` sees the handler set when the copy
  was made.

``using()`` restores the handler that was current when it was entered, in
the context it runs in (a generator or coroutine suspended inside the block
keeps its handler while suspended only if it runs in its own context).
"""
from __future__ import annotations

import contextlib
import ctypes
import os
import sys
import threading
from ctypes import (CFUNCTYPE, POINTER, Structure, c_char, c_int, c_size_t, c_uint8, c_void_p,
                    py_object, sizeof)

from . import _guard

MEM_HANDLER_NAME = b"mem_handler"


class PyDataMemAllocator(Structure):
    _fields_ = [("ctx", c_void_p), ("malloc", c_void_p), ("calloc", c_void_p),
                ("realloc", c_void_p), ("free", c_void_p)]


class PyDataMem_Handler(Structure):
    _fields_ = [("name", c_char * 127), ("version", c_uint8), ("allocator", PyDataMemAllocator)]


assert sizeof(PyDataMemAllocator) == 40 and sizeof(PyDataMem_Handler) == 168
assert PyDataMem_Handler.allocator.offset == 128

# NEP 49 signatures
MallocFunc = CFUNCTYPE(c_void_p, c_void_p, c_size_t)
CallocFunc = CFUNCTYPE(c_void_p, c_void_p, c_size_t, c_size_t)
ReallocFunc = CFUNCTYPE(c_void_p, c_void_p, c_void_p, c_size_t)
FreeFunc = CFUNCTYPE(None, c_void_p, c_void_p, c_size_t)
_PROTO = {"malloc": MallocFunc, "calloc": CallocFunc, "realloc": ReallocFunc, "free": FreeFunc}
_ARITY = {"malloc": 2, "calloc": 3, "realloc": 3, "free": 3}  # with ctx
_KINDS = ("malloc", "calloc", "realloc", "free")

#: device names a handler may declare (its memory kind), and their DLPack device type
DEVICES = {"cpu": 1, "cuda": 2, "cuda_host": 3, "opencl": 4, "vulkan": 7, "metal": 8,
           "vpi": 9, "rocm": 10, "rocm_host": 11, "ext_dev": 12, "cuda_managed": 13,
           "oneapi": 14, "webgpu": 15, "hexagon": 16, "maia": 17, "trn": 18}

_libc = ctypes.CDLL(None)
_LIBC_ADDR = {k: ctypes.cast(getattr(_libc, k), c_void_p).value for k in _KINDS}

# ---------------------------------------------------------------- libcapsan / numpy API

_py = ctypes.PyDLL(None)
_Capsule_New = _py.PyCapsule_New
_Capsule_New.restype, _Capsule_New.argtypes = py_object, [c_void_p, c_void_p, c_void_p]
_Capsule_GetPointer = _py.PyCapsule_GetPointer
_Capsule_GetPointer.restype, _Capsule_GetPointer.argtypes = c_void_p, [py_object, ctypes.c_char_p]
_Capsule_GetName = _py.PyCapsule_GetName
_Capsule_GetName.restype, _Capsule_GetName.argtypes = c_void_p, [py_object]
_Capsule_IsValid = _py.PyCapsule_IsValid
_Capsule_IsValid.restype, _Capsule_IsValid.argtypes = c_int, [py_object, ctypes.c_char_p]
_IncRef = _py.Py_IncRef
_IncRef.restype, _IncRef.argtypes = None, [py_object]
_DecRef = _py.Py_DecRef
_DecRef.restype, _DecRef.argtypes = None, [py_object]

_lib_lock = threading.Lock()
_api = None  # (set_handler, get_handler, where)
_api_keep: list = []


def _mapped_libcapsan() -> str | None:
    """Path of a libcapsan.so already mapped into this process (preloaded or
    loaded by the package), so that we never load a second copy."""
    try:
        with open("/proc/self/maps") as f:
            for line in f:
                path = line.rstrip("\n").split(None, 5)[-1] if line.count(" ") >= 5 else ""
                if path.endswith("/libcapsan.so"):
                    return path
    except OSError:
        pass
    return None


def libcapsan():
    """The libcapsan.so of this process as a ctypes.PyDLL, or None.

    The package's own handle when it has one; else a copy already mapped
    (LD_PRELOAD, or loaded before); else $CAPSAN_LIB; else
    <package>/../../lib/libcapsan.so (the build tree). dlopen of a file that
    is already loaded returns that copy, never a second one.
    """
    pkg = __package__ or "capsan"
    own = sys.modules.get(pkg + "._lib")  # the package's binding (capsan/_lib.py)
    if own is not None and isinstance(getattr(own, "lib", None), ctypes.CDLL):
        return own.lib
    for path in (_mapped_libcapsan(), os.environ.get("CAPSAN_LIB"),
                 os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "lib",
                              "libcapsan.so")):
        if path and os.path.exists(path):
            try:
                return ctypes.PyDLL(os.path.realpath(path))
            except OSError:
                continue
    return None


def _np_core(name):
    """numpy's private core module `name`: numpy._core.NAME in numpy 2
    (numpy.core is a shim there that warns on every attribute), else
    numpy.core.NAME (numpy 1.x)."""
    import importlib
    try:
        return importlib.import_module("numpy._core." + name)
    except ImportError:
        return importlib.import_module("numpy.core." + name)


def _numpy_api():
    """(set, get, where): numpy's PyDataMem_SetHandler / GetHandler, through
    libcapsan's capsan_set_handler / capsan_get_handler when it is there
    (the runtime's entry points), else straight from numpy's API table."""
    global _api
    if _api is not None:
        return _api
    with _lib_lock:
        if _api is not None:
            return _api
        mu = _np_core("_multiarray_umath")
        from . import _lib
        s = g = None
        where = "numpy"
        if _lib.has("capsan_set_handler") and _lib.has("capsan_get_handler"):
            # through capsan._lib's bindings: ctypes function objects are
            # shared per library handle, so their types must not be re-set here
            def s(addr):
                return _lib._steal(_lib.call("capsan_set_handler", addr))

            def g():
                return _lib._steal(_lib.call("capsan_get_handler"))
            try:
                g()  # probe: its numpy lookup must work on this numpy
                where = "libcapsan"
            except Exception as e:  # noqa: BLE001
                where = f"numpy (libcapsan's capsan_get_handler failed: {e})"
                s = g = None
        if s is None:
            # numpy's own API table (what import_array() reads): the
            # _ARRAY_API capsule is unnamed in numpy 1.x and 2.x
            cap = mu._ARRAY_API
            name = _Capsule_GetName(cap)
            gp = _py.PyCapsule_GetPointer
            table = ctypes.PYFUNCTYPE(c_void_p, py_object, c_void_p)(
                ctypes.cast(gp, c_void_p).value)(cap, name)
            fptrs = ctypes.cast(table, POINTER(c_void_p))
            s = ctypes.PYFUNCTYPE(py_object, c_void_p)(fptrs[304])
            g = ctypes.PYFUNCTYPE(py_object)(fptrs[305])
            s.restype, s.argtypes = py_object, [c_void_p]
            g.restype, g.argtypes = py_object, []
            _api_keep.append(mu)
        _api = (s, g, where)
        return _api


# ---------------------------------------------------------------- the registry

class HandlerInfo:
    """What capsan knows about a handler it built (see handler_info())."""

    def __init__(self, name, device, kinds, ctx):
        self.name = name
        self.device = device
        self.kinds = kinds            # {"malloc": "python" | "c" | "c-noctx" | "libc"}
        self.ctx = ctx
        self.calls = {k: 0 for k in _KINDS}
        self.errors = 0               # Python exceptions turned into NULL / ignored
        self.alive = True
        self.extra = {}

    def __repr__(self):
        return (f"HandlerInfo(name={self.name!r}, device={self.device!r}, kinds={self.kinds}, "
                f"calls={self.calls}, errors={self.errors}, alive={self.alive})")


class _State:
    __slots__ = ("struct", "keep", "thunks", "info", "on_close")


_handlers: dict[int, _State] = {}
_graveyard: list = []  # structs of dead handlers: their addresses are never reused


def _handler_capsule_destructor(cap, _handlers=_handlers, _graveyard=_graveyard,
                                _DecRef=_DecRef):
    # The capsule dies when the user and the last array using it let go.
    st = _handlers.pop(cap, None)
    if st is None:
        return
    _DecRef(st)  # allocator()'s own reference
    st.info.alive = False
    _graveyard.append(st.struct)
    st.thunks.free()
    st.keep = None
    if st.on_close is not None:
        try:
            st.on_close()
        except Exception:
            pass


_dtor_cb = CFUNCTYPE(None, c_void_p)(_handler_capsule_destructor)
_DTOR_ADDR, _dtor_guard = _guard.guard(_dtor_cb)


def _as_capsule(h):
    """A mem_handler capsule from a capsule or an object with .handler."""
    if h is None:
        return None
    if type(h).__name__ != "PyCapsule":
        h = getattr(h, "handler", h)
    if type(h).__name__ != "PyCapsule":
        raise TypeError(f"not a mem_handler capsule: {type(h).__name__}")
    return h


def handler_info(h) -> HandlerInfo | None:
    """HandlerInfo of a handler built by allocator() (None for others)."""
    st = _handlers.get(id(_as_capsule(h)))
    return st.info if st else None


# ---------------------------------------------------------------- unraisable reports

class _Unraisable:
    """The object named in an unraisable report: 'capsan allocator NAME: KIND'."""

    def __init__(self, name, kind, exc):
        self.name, self.kind, self.exc = name, kind, exc

    def __call__(self):
        exc, self.exc = self.exc, None
        raise exc

    def __repr__(self):
        return f"<capsan allocator {self.name!r}: {self.kind}>"


_RaiserProto = CFUNCTYPE(None)


def report_unraisable(exc: BaseException, name: str = "?", kind: str = "?") -> None:
    """Hand exc to sys.unraisablehook the way CPython does for a callback
    that cannot raise: through a ctypes callback that raises it, which
    ctypes reports with PyErr_WriteUnraisable. The hook's object is the
    callback, named 'capsan allocator NAME: KIND' (3.10-3.12); 3.13 names it
    in err_msg instead and passes None as the object."""
    _RaiserProto(_Unraisable(name, kind, exc))()


# ---------------------------------------------------------------- building

def _is_cfunc(f) -> bool:
    return isinstance(f, ctypes._CFuncPtr)


def _wrap_python(kind, fn, name, info, ctx_obj, has_ctx, report=report_unraisable):
    calls = info.calls
    if kind == "free":
        def w(_ctx, ptr, size):
            calls["free"] += 1
            try:
                if has_ctx:
                    fn(ctx_obj, ptr or 0, size)
                else:
                    fn(ptr or 0, size)
            except BaseException as e:  # noqa: B902 - a callback must not raise
                info.errors += 1
                report(e, name, kind)
    elif kind == "realloc":
        def w(_ctx, ptr, size):
            calls["realloc"] += 1
            try:
                r = fn(ctx_obj, ptr or 0, size) if has_ctx else fn(ptr or 0, size)
                return int(r or 0)
            except BaseException as e:  # noqa: B902
                info.errors += 1
                report(e, name, kind)
                return 0
    elif kind == "calloc":
        def w(_ctx, n, sz):
            calls["calloc"] += 1
            try:
                r = fn(ctx_obj, n, sz) if has_ctx else fn(n, sz)
                return int(r or 0)
            except BaseException as e:  # noqa: B902
                info.errors += 1
                report(e, name, kind)
                return 0
    else:
        def w(_ctx, size):
            calls["malloc"] += 1
            try:
                r = fn(ctx_obj, size) if has_ctx else fn(size)
                return int(r or 0)
            except BaseException as e:  # noqa: B902
                info.errors += 1
                report(e, name, kind)
                return 0
    w.__qualname__ = f"capsan allocator {name!r} {kind}"
    return _PROTO[kind](w)


def _c_takes_ctx(kind, f, takes_ctx):
    if isinstance(takes_ctx, dict):
        takes_ctx = takes_ctx.get(kind)
    if takes_ctx is not None:
        return bool(takes_ctx)
    at = getattr(f, "argtypes", None)
    if at is not None:
        if len(at) == _ARITY[kind]:
            return True
        if len(at) == _ARITY[kind] - 1 or (kind == "free" and len(at) == 1):
            return False
        raise TypeError(f"{kind}: argtypes has {len(at)} arguments; NEP 49 {kind} takes "
                        f"{_ARITY[kind]} (with ctx) or {_ARITY[kind] - 1} (without)")
    raise TypeError(f"{kind}: cannot tell whether this C function takes the ctx argument; "
                    f"set its argtypes or pass takes_ctx=True/False")


def allocator(name: str, malloc=None, calloc=None, realloc=None, free=None, *, ctx=None,
              device: str | None = None, takes_ctx=None):
    """A new version-1 ``"mem_handler"`` capsule (see the module docstring).

    name     -- the handler's name (at most 126 UTF-8 bytes), what
                numpy's ``get_handler_name(arr)`` reports
    malloc, calloc, realloc, free -- Python callables, C functions (ctypes
                function pointers or addresses) or None (libc's)
    ctx      -- passed as the first argument: the ``ctx`` field for C
                functions (an int address, a ctypes object, kept alive with
                the handler, or None for NULL); the first positional argument
                for Python callables (omitted when None)
    device   -- the memory kind the handler's blocks are, one of DEVICES
                ("cuda_host" for pinned memory...); default "cpu"
    takes_ctx -- for C functions without argtypes: True if they have the NEP
                49 signature, False for libc style (a dict per kind also works)
    """
    bname = name.encode("utf-8")
    if len(bname) > 126 or b"\0" in bname:
        raise ValueError("a handler name is at most 126 bytes, without NUL")
    dev = (device or "cpu").lower().replace("-", "_")
    if dev not in DEVICES:
        raise ValueError(f"unknown device {device!r}; one of {sorted(DEVICES)}")
    info = HandlerInfo(name, dev, {}, ctx)
    keep = [ctx]
    fns = {"malloc": malloc, "calloc": calloc, "realloc": realloc, "free": free}
    specs, kinds_order = [], []
    direct = {}
    if ctx is None:
        ctx_addr = None
    elif isinstance(ctx, int):
        ctx_addr = ctx
    elif isinstance(ctx, (ctypes._SimpleCData, Structure, ctypes.Array, ctypes.Union)):
        ctx_addr = ctypes.cast(ctx, c_void_p).value if isinstance(ctx, c_void_p) else \
            ctypes.addressof(ctx)
    else:
        ctx_addr = None  # a Python object: only Python callables see it
        if any(f is not None and (_is_cfunc(f) or isinstance(f, int)) for f in fns.values()):
            raise TypeError("ctx for C functions must be an address or a ctypes object")
    for kind in _KINDS:
        f = fns[kind]
        if f is None:
            info.kinds[kind] = "libc"
            specs.append(("drop_ctx", _LIBC_ADDR[kind]))
            kinds_order.append(kind)
        elif _is_cfunc(f) or isinstance(f, int):
            addr = ctypes.cast(f, c_void_p).value if _is_cfunc(f) else f
            if not addr:
                raise ValueError(f"{kind}: NULL function pointer (NEP 49 accepts none)")
            keep.append(f)
            if _c_takes_ctx(kind, f, takes_ctx):
                info.kinds[kind] = "c"
                direct[kind] = addr
            else:
                info.kinds[kind] = "c-noctx"
                specs.append(("drop_ctx", addr))
                kinds_order.append(kind)
        elif callable(f):
            cb = _wrap_python(kind, f, name, info, ctx, ctx is not None)
            keep.append(cb)
            info.kinds[kind] = "python"
            specs.append(("guard", ctypes.cast(cb, c_void_p).value))
            kinds_order.append(kind)
        else:
            raise TypeError(f"{kind}: expected a callable, a ctypes function pointer, an "
                            f"address or None, got {type(f).__name__}")
    if specs and not _guard.available:
        # no thunks here: Python callables are called bare, ctx-less C functions
        # through a Python adapter
        thunks = _guard.Thunks([s for s in specs if s[0] == "guard"])
        it = iter(thunks.addresses)
        addrs = []
        for (k, a), kind in zip(specs, kinds_order):
            if k == "guard":
                addrs.append(next(it))
            else:
                adapter = _noctx_adapter(kind, a)
                keep.append(adapter)
                addrs.append(ctypes.cast(adapter, c_void_p).value)
    else:
        thunks = _guard.Thunks(specs)
        addrs = thunks.addresses
    for kind, a in zip(kinds_order, addrs):
        direct[kind] = a
    st = PyDataMem_Handler()
    st.name = bname
    st.version = 1
    st.allocator = PyDataMemAllocator(ctx_addr, direct["malloc"], direct["calloc"],
                                      direct["realloc"], direct["free"])
    state = _State()
    state.struct, state.keep, state.thunks, state.info, state.on_close = st, keep, thunks, info, None
    try:
        cap = _Capsule_New(ctypes.addressof(st), _NAME_BUF_ADDR, _DTOR_ADDR)
    except BaseException:
        thunks.free()
        raise
    _handlers[id(cap)] = state
    _IncRef(state)  # dropped by the destructor only (see Lifetime)
    if DEVICES[info.device] != DEVICES["cpu"]:
        # the runtime reports this memory exported through DLPack as plain
        # CPU (dlpack-device-mismatch)
        from . import _lib
        if _lib.has("capsan_handler_set_device"):
            _lib.call("capsan_handler_set_device", cap, DEVICES[info.device])
    return cap


_NAME_BUF = ctypes.create_string_buffer(MEM_HANDLER_NAME)  # immortal: R2
_IncRef(_NAME_BUF)  # module teardown must not free it either
_NAME_BUF_ADDR = ctypes.addressof(_NAME_BUF)


def _noctx_adapter(kind, addr):
    proto = {"malloc": CFUNCTYPE(c_void_p, c_size_t),
             "calloc": CFUNCTYPE(c_void_p, c_size_t, c_size_t),
             "realloc": CFUNCTYPE(c_void_p, c_void_p, c_size_t),
             "free": CFUNCTYPE(None, c_void_p, c_size_t)}[kind](addr)
    return _PROTO[kind](lambda _ctx, *a: proto(*a))


def _set_on_close(cap, fn):
    _handlers[id(cap)].on_close = fn


# ---------------------------------------------------------------- switching

def get_handler():
    """numpy's current handler capsule in this context (PyDataMem_GetHandler)."""
    return _numpy_api()[1]()


def set_handler(handler):
    """Make `handler` numpy's current one in this context (None: numpy's
    default) and return the previous one. Affects the current context only:
    see the module docstring for threads and asyncio."""
    cap = _as_capsule(handler)
    if cap is not None:
        if not _Capsule_IsValid(cap, MEM_HANDLER_NAME):
            raise ValueError("not a valid 'mem_handler' capsule (numpy 1.24 would take it "
                             "and fail at the next allocation, rulebook R27)")
    return _numpy_api()[0](id(cap) if cap is not None else None)


@contextlib.contextmanager
def using(handler):
    """``with using(h):`` allocate through h in this context, then restore
    the handler that was current before (also a decorator). Threads started
    inside the block do NOT inherit h (but where threads start in a copy of
    their starter's context: sys.flags.thread_inherit_context); asyncio
    tasks created inside do."""
    old = set_handler(handler)
    try:
        yield handler
    finally:
        set_handler(old)


def handler_name(arr=None):
    """The name of the handler that owns arr's data (None for a view or an
    array that does not own its data), or of the current handler."""
    get_handler_name = _np_core("multiarray").get_handler_name
    return get_handler_name() if arr is None else get_handler_name(arr)


def handler_version(arr=None):
    get_handler_version = _np_core("multiarray").get_handler_version
    return get_handler_version() if arr is None else get_handler_version(arr)


def handler_struct(h) -> PyDataMem_Handler:
    """The PyDataMem_Handler a mem_handler capsule points to (read only)."""
    cap = _as_capsule(h)
    p = _Capsule_GetPointer(cap, MEM_HANDLER_NAME)
    return PyDataMem_Handler.from_address(p)


def live_handlers() -> int:
    """Handlers built by allocator() whose capsule is still alive."""
    return len(_handlers)


__all__ = ["allocator", "using", "get_handler", "set_handler", "handler_name",
           "handler_version", "handler_info", "handler_struct", "live_handlers", "libcapsan",
           "report_unraisable", "HandlerInfo", "PyDataMem_Handler", "PyDataMemAllocator",
           "MallocFunc", "CallocFunc", "ReallocFunc", "FreeFunc", "DEVICES"]
