"""Finding and binding libcapsan.so: the one runtime of the process.

Two copies of the runtime in one process would fight over the same GOT
slots, so the library is looked up in this order and never loaded twice:

1. already in the global scope (LD_PRELOAD, `capsan run`): use that;
2. already mapped by anyone else (a dlopen with RTLD_LOCAL): re-open that
   very file with RTLD_NOLOAD;
3. the file named by $CAPSAN_LIB;
4. the file installed with this very package, as its installer recorded it
   in the dist-info's RECORD: `pip install .` (the wheel's data file,
   PREFIX/lib/libcapsan.so beside PREFIX/bin/capsan) and `make install`
   (PREFIX/lib/libcapsan.so) both write one;
5. the file beside this package: build/python/capsan -> build/lib/libcapsan.so
   (checkout build), PREFIX/lib/pythonX.Y/site-packages/capsan ->
   PREFIX/lib/libcapsan.so (an installed tree without a RECORD).

The library is loaded with ctypes.PyDLL, so every call keeps the GIL (the
runtime's Python-facing entry points need it) and a Python exception set by
the runtime is raised on return.
"""
from __future__ import annotations

import ctypes
import os

_HERE = os.path.dirname(os.path.abspath(__file__))
_NAME = "libcapsan.so"
# relative to this package's directory
_CANDIDATES = (
    os.path.join("..", "..", "lib", _NAME),        # build/python/capsan -> build/lib
    os.path.join("..", "..", "..", _NAME),         # PREFIX/lib/pythonX.Y/site-packages/capsan -> PREFIX/lib
)


class CapsanLoadError(ImportError):
    pass


def _mapped_copies() -> list[str]:
    """Paths of every libcapsan*.so already mapped into this process."""
    out = []
    try:
        with open("/proc/self/maps") as f:
            for line in f:
                parts = line.split(None, 5)
                if len(parts) == 6:
                    path = parts[5].strip()
                    base = os.path.basename(path)
                    if base.startswith("libcapsan") and ".so" in base and path not in out:
                        out.append(path)
    except OSError:
        pass
    return out


def _same_file(a: str, b: str) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:
        return False


def _recorded() -> str | None:
    """The libcapsan.so named in the RECORD of the dist-info beside this
    package, the one its installer wrote with it (the checkout build's
    dist-info has none). Read directly: importlib.metadata costs more than
    the rest of `import capsan`."""
    site = os.path.dirname(_HERE)
    try:
        infos = [n for n in os.listdir(site)
                 if n.startswith("capsan-") and n.endswith(".dist-info")]
    except OSError:
        return None
    for info in infos:
        try:
            with open(os.path.join(site, info, "RECORD"), encoding="utf-8") as f:
                paths = [line.split(",")[0] for line in f]
        except OSError:
            continue
        if "capsan/_lib.py" not in paths:
            continue
        for rel in paths:
            if os.path.basename(rel) == _NAME:
                return os.path.normpath(os.path.join(site, rel))
    return None


def _locate() -> tuple[ctypes.PyDLL, str, str]:
    """(library, path, how it was found)."""
    env = os.environ.get("CAPSAN_LIB") or None
    # 1. the global scope: LD_PRELOAD put it there
    glob = ctypes.PyDLL(None)
    if hasattr(glob, "capsan_start"):
        mapped = _mapped_copies()
        path = mapped[0] if mapped else "(global scope)"
        _warn_if_other(env, path)
        return glob, path, "preloaded"
    # 2. mapped, but not global: the same file again (dlopen returns the
    #    loaded object; RTLD_NOLOAD guarantees nothing new is loaded)
    for path in _mapped_copies():
        try:
            lib = ctypes.PyDLL(path, mode=os.RTLD_NOLOAD | os.RTLD_LOCAL)
        except OSError:
            continue
        if hasattr(lib, "capsan_start"):
            _warn_if_other(env, path)
            return lib, path, "already loaded"
    # 3./4./5. load it
    tried = []
    if env:
        paths, how = [env], ["CAPSAN_LIB"]
    else:
        rec = _recorded()
        paths = ([rec] if rec else []) + [os.path.normpath(os.path.join(_HERE, c))
                                          for c in _CANDIDATES]
        how = (["installed with the package"] if rec else []) + \
            ["beside the package"] * len(_CANDIDATES)
    for path, found in zip(paths, how):
        tried.append(path)
        if not os.path.exists(path):
            continue
        try:
            lib = ctypes.PyDLL(os.path.abspath(path), mode=os.RTLD_LOCAL)
        except OSError as e:
            raise CapsanLoadError(f"capsan: cannot load {path}: {e}") from e
        if not hasattr(lib, "capsan_start"):
            raise CapsanLoadError(f"capsan: {path} is not libcapsan.so (no capsan_start)")
        return lib, os.path.abspath(path), found
    raise CapsanLoadError(
        "capsan: libcapsan.so not found (tried " + ", ".join(tried) + "); build it with "
        "`make`, or set CAPSAN_LIB=/path/to/libcapsan.so")


def _warn_if_other(env, path):
    if env and os.path.exists(path) and not _same_file(env, path):
        import warnings
        warnings.warn(f"capsan: CAPSAN_LIB={env} ignored: {path} is already loaded in this "
                      "process (a second runtime would fight the first)", RuntimeWarning,
                      stacklevel=4)


try:
    lib, path, found_by = _locate()
    load_error = None
except CapsanLoadError as _e:
    # raised by `import capsan`; kept quiet while pytest's plugin loader
    # imports the package (capsan.pytest_plugin reports it if a test needs it)
    lib, path, found_by, load_error = None, None, None, _e

# ---- signatures (preload/capsan.h) ----
# Entry points that return a new reference return void* here: a py_object
# restype would take one more reference (ctypes increments what it gets).
_SIGS = {
    "capsan_start": ([], ctypes.c_int),
    "capsan_stop": ([], None),
    "capsan_stopped": ([], ctypes.c_int),
    "capsan_active": ([], ctypes.c_int),
    "capsan_preloaded": ([], ctypes.c_int),
    "capsan_findings_count": ([], ctypes.c_uint64),
    "capsan_findings_json": ([ctypes.c_uint64], ctypes.c_void_p),
    "capsan_free": ([ctypes.c_void_p], None),
    "capsan_handler_new": ([ctypes.c_void_p], ctypes.c_void_p),
    "capsan_set_handler": ([ctypes.c_void_p], ctypes.c_void_p),
    "capsan_get_handler": ([], ctypes.c_void_p),
    "capsan_handler_leaks": ([ctypes.c_void_p], ctypes.c_int),
    "capsan_handler_leaks_except": ([ctypes.c_void_p, ctypes.POINTER(ctypes.c_uint64), ctypes.c_size_t],
                                    ctypes.c_int),
    "capsan_handler_live": ([ctypes.c_void_p, ctypes.POINTER(ctypes.c_uint64), ctypes.c_size_t],
                            ctypes.c_size_t),
    "capsan_handler_leaks_since": ([ctypes.c_void_p, ctypes.c_uint64,
                                    ctypes.POINTER(ctypes.c_uint64), ctypes.c_size_t],
                                   ctypes.c_int),
    "capsan_handler_live_since": ([ctypes.c_void_p, ctypes.c_uint64,
                                   ctypes.POINTER(ctypes.c_uint64), ctypes.c_size_t],
                                  ctypes.c_size_t),
    "capsan_scope_live": ([ctypes.c_uint64], ctypes.c_uint64),
    "capsan_scope_live_keys": ([ctypes.c_uint64, ctypes.POINTER(ctypes.c_uint64),
                                ctypes.c_size_t], ctypes.c_size_t),
    "capsan_reached": ([ctypes.py_object, ctypes.POINTER(ctypes.c_uint64), ctypes.c_size_t,
                        ctypes.POINTER(ctypes.c_uint8)], ctypes.c_int),
    "capsan_now_ns": ([], ctypes.c_uint64),
    "capsan_scope_dlpack_leaks": ([ctypes.c_uint64], ctypes.c_int),
    "capsan_handler_set_device": ([ctypes.py_object, ctypes.c_int], ctypes.c_int),
    "capsan_capsule_peek": ([ctypes.py_object], ctypes.c_void_p),
    "capsan_xapi_follow": ([ctypes.c_void_p], ctypes.c_void_p),
    "capsan_xapi_original": ([ctypes.c_void_p, ctypes.c_int], ctypes.c_void_p),
    "capsan_arrow_original": ([ctypes.c_void_p, ctypes.c_int, ctypes.c_int], ctypes.c_void_p),
    "capsan_arrow_at": ([ctypes.c_void_p], ctypes.c_int),
}
_fn = {}
for _name, (_args, _res) in _SIGS.items():
    _f = getattr(lib, _name, None) if lib is not None else None
    if _f is not None:
        _f.argtypes = _args
        _f.restype = _res
        _fn[_name] = _f

_Py_DecRef = ctypes.pythonapi.Py_DecRef
_Py_DecRef.argtypes = [ctypes.c_void_p]
_Py_DecRef.restype = None


def call(name, *args):
    f = _fn.get(name)
    if f is None and load_error is not None:
        raise load_error
    if f is None:
        raise NotImplementedError(f"capsan: {path} has no {name}() (an older runtime?)")
    return f(*args)


def has(name) -> bool:
    return name in _fn


def _steal(addr):
    """The object behind a new reference returned as void*; the reference is
    handed over to Python."""
    if not addr:
        raise SystemError("capsan: the runtime returned NULL without an exception")
    obj = ctypes.cast(addr, ctypes.py_object).value  # +1
    _Py_DecRef(addr)                                  # the runtime's reference
    return obj


def _ref(obj):
    return None if obj is None else id(obj)


# ---- thin Pythonic wrappers ----

def start() -> bool:
    """The runtime's start alone (exchange.start also follows the exchange
    tables loaded before it)."""
    return bool(call("capsan_start"))


def stop() -> None:
    call("capsan_stop")


def stopped() -> bool:
    """capsan.stop() stopped recording: it does not start again."""
    return bool(call("capsan_stopped")) if has("capsan_stopped") else False


def active() -> bool:
    return bool(call("capsan_active"))


def preloaded() -> bool:
    return bool(call("capsan_preloaded")) if has("capsan_preloaded") else found_by == "preloaded"


def findings_count() -> int:
    return int(call("capsan_findings_count"))


def findings_json(since: int) -> str:
    p = call("capsan_findings_json", since)
    if not p:
        return "[]"
    try:
        return ctypes.string_at(p).decode("utf-8", "replace")
    finally:
        call("capsan_free", p)


def handler_new(inner=None):
    return _steal(call("capsan_handler_new", _ref(inner)))


def set_handler(handler):
    return _steal(call("capsan_set_handler", _ref(handler)))


def get_handler():
    return _steal(call("capsan_get_handler"))


def handler_leaks(handler, held=(), since=0) -> int:
    """Report the handler's live blocks (allocated at or after `since`, a
    capsan_now_ns stamp) as leaks, except `held` (addresses)."""
    arr = (ctypes.c_uint64 * len(held))(*sorted(held)) if held else None
    if has("capsan_handler_leaks_since"):
        return int(call("capsan_handler_leaks_since", _ref(handler), since, arr, len(held)))
    if held:
        return int(call("capsan_handler_leaks_except", _ref(handler), arr, len(held)))
    return int(call("capsan_handler_leaks", _ref(handler)))


def handler_live(handler, since=0) -> list:
    """The addresses of the handler's blocks still alive, allocated at or
    after `since` (what handler_leaks judges)."""
    if has("capsan_handler_live_since"):
        def live(out, n):
            return int(call("capsan_handler_live_since", _ref(handler), since, out, n))
    else:
        def live(out, n):
            return int(call("capsan_handler_live", _ref(handler), out, n))
    n = live(None, 0)
    if not n:
        return []
    arr = (ctypes.c_uint64 * n)()
    n = min(n, live(arr, n))
    return list(arr[:n])


def scope_live(since_ns: int) -> int:
    """How many live objects the runtime knows whose latest event came at or
    after since_ns: 0 when a scope that began then has nothing to judge."""
    return int(call("capsan_scope_live", since_ns))


def scope_live_key_count(since_ns: int) -> int:
    """How many of them are NumPy blocks and DLPack tensors (no list of
    their addresses is made on this side: a stale copy would pass for a
    reference in a scan)."""
    return int(call("capsan_scope_live_keys", since_ns, None, 0))


def scope_live_keys(since_ns: int) -> list:
    """The NumPy block and DLPack tensor addresses among them, sorted."""
    n = scope_live_key_count(since_ns)
    if not n:
        return []
    arr = (ctypes.c_uint64 * n)()
    n = min(n, int(call("capsan_scope_live_keys", since_ns, arr, n)))
    return list(arr[:n])


def now_ns() -> int:
    return int(call("capsan_now_ns"))


def scope_dlpack_leaks(since_ns: int) -> int:
    return int(call("capsan_scope_dlpack_leaks", since_ns))
