"""numpy's test_mem_policy.py scenarios under a Python-callable handler made
with capsan.allocator(): the "secret data" allocator shifts every block by
64 bytes and keeps its size in the prefix, then checks both on free.

Views, subclasses, threads (start on the default handler), asyncio tasks
(inherit the context), resize/realloc, sort scratch buffers, fromiter,
pickling, error paths, an allocator that raises, C-function handlers and the
handler's lifetime. Prints `RESULT {json}`; correct code only, so a run under
capsan must have zero findings."""
import asyncio
import contextvars
import ctypes
import gc
import json
import pickle
import sys
import threading
from ctypes import c_size_t, c_void_p

import numpy as np
# numpy 2 imports numpy.random lazily, at first use: its module data would
# come from the handler installed then (numpy 1.x imports it with numpy)
import numpy.random  # noqa: F401

import importlib

A = importlib.import_module("capsan.allocator")  # capsan.allocator may be re-exported as a function

NAME = "secret_data_allocator"
libc = ctypes.CDLL(None)
for fn, res, args in (("malloc", c_void_p, [c_size_t]), ("calloc", c_void_p, [c_size_t, c_size_t]),
                      ("realloc", c_void_p, [c_void_p, c_size_t]), ("free", None, [c_void_p])):
    getattr(libc, fn).restype = res
    getattr(libc, fn).argtypes = args

SHIFT = 64
live = {}
st = {"null_frees": 0, "unknown_frees": 0, "bad_prefix": 0, "size_mismatch": []}
lock = threading.Lock()


def publish(real, n):
    """A block of n bytes at real, handed out SHIFT bytes further on."""
    if not real:
        return 0
    c_size_t.from_address(real).value = n
    with lock:
        live[real + SHIFT] = n
    return real + SHIFT


def s_malloc(n):
    return publish(libc.malloc(n + SHIFT), n)


def s_calloc(nelem, elsize):
    n = nelem * elsize
    p = s_malloc(n)
    if p:
        ctypes.memset(p, 0, n)
    return p


def s_realloc(p, n):
    if not p:
        return s_malloc(n)
    with lock:
        if live.pop(p, None) is None:
            st["unknown_frees"] += 1
            return 0
    return publish(libc.realloc(p - SHIFT, n + SHIFT), n)


def s_free(p, size):
    if not p:
        st["null_frees"] += 1  # numpy 1.24's np.sort does free(NULL, n) (R29)
        return
    with lock:
        n = live.pop(p, None)
    if n is None:
        st["unknown_frees"] += 1
        return
    if c_size_t.from_address(p - SHIFT).value != n:
        st["bad_prefix"] += 1
    if n != size:
        st["size_mismatch"].append([n, size])  # numpy's size is a best guess
    libc.free(p - SHIFT)


h = A.allocator(NAME, malloc=s_malloc, calloc=s_calloc, realloc=s_realloc, free=s_free)
info = A.handler_info(h)
res = {"api": A._numpy_api()[2].split(" ")[0], "numpy": np.__version__}
name = A.handler_name

# test_set_policy / test_default_policy_singleton
default = A.get_handler()
res["default_name"] = name()
res["default_singleton"] = A.get_handler() is default
old = A.set_handler(h)
res["set_returns_old"] = old is default
res["current_after_set"] = name()
res["get_is_h"] = A.get_handler() is h
A.set_handler(old)
res["restored"] = name()
with A.using(h) as hh:
    res["using_yields"] = hh is h
    a = np.arange(10)
    v = a[::2]
    res["owner_name"] = name(a)
    res["view_name"] = name(v)
    res["version"] = A.handler_version(a)
res["after_block"] = name()
res["owner_after_block"] = name(a)
res["values"] = a.sum().item() == 45 and v.tolist() == [0, 2, 4, 6, 8]
del a, v


# test_policy_propagation: subclass and view chains
class MyArr(np.ndarray):
    pass


with A.using(h):
    a = np.arange(10).view(MyArr).reshape((2, 5))
    direct = MyArr((3,))
    m = np.asmatrix(np.ones((2, 2)))
res["subclass"] = [name(a), name(a.base), name(a.base.base), name(direct), name(m)]
del a, direct, m


# test_thread_locality: a new thread starts on the default handler
def in_thread(out):
    out["thread_default"] = name()
    out["thread_array"] = name(np.empty(10))
    with A.using(h):
        out["thread_using"] = name(np.empty(10))


tout = {}
with A.using(h):
    th = threading.Thread(target=in_thread, args=(tout,))
    th.start()
    th.join()
    res["main_during_thread"] = name(np.empty(3))
res["thread"] = tout


# many threads allocating and freeing through h at once
def churn():
    with A.using(h):
        for i in range(200):
            x = np.ones(i + 1)
            x.resize(2 * i + 2, refcheck=False)
            del x


ths = [threading.Thread(target=churn) for _ in range(4)]
for t in ths:
    t.start()
for t in ths:
    t.join()


# test_context_locality: asyncio tasks inherit a copy of the context
async def child(tag, out, use=False):
    if use:
        with A.using(h):
            out[tag] = name(np.empty(4))
    else:
        await asyncio.sleep(0)
        out[tag] = name(np.empty(4))


async def main():
    out = {}
    with A.using(h):
        t1 = asyncio.create_task(child("created_inside", out))
    t2 = asyncio.create_task(child("created_outside", out))
    t3 = asyncio.create_task(child("own_using", out, use=True))
    await asyncio.gather(t1, t2, t3)
    out["main_after"] = name()
    return out


res["asyncio"] = asyncio.run(main())
with A.using(h):
    ctx = contextvars.copy_context()
res["copied_context"] = ctx.run(lambda: name(np.empty(2)))

# resize (realloc), np.resize, sort (scratch buffer), fromiter (realloc as it
# grows), pickling (__setstate__ frees and allocates), resize(0) (R29 sizes)
with A.using(h):
    a = np.arange(100, dtype=np.float64)
    a.resize(1000, refcheck=False)
    r1 = name(a)
    b = np.resize(np.arange(7), 50)
    c = np.random.default_rng(0).permutation(5000)
    c.sort(kind="mergesort")  # mergesort needs a scratch buffer
    c2 = np.sort(c[::-1])
    d = np.fromiter((i * 0.5 for i in range(5000)), dtype=np.float64)
    e = pickle.loads(pickle.dumps(d))
    f = np.arange(12.0)
    f.resize(0, refcheck=False)
    g = np.concatenate([d, d]).reshape(2, -1).T.copy()
    s = np.array(["a", "bb", "ccc"])
res["ops"] = {"resize": r1, "np_resize": name(b), "fromiter": name(d), "pickle": name(e),
              "concat": name(g), "strings": name(s), "resize0": name(f)}
res["ops_values"] = (a[:100].sum().item() == 4950 and b[:7].tolist() == list(range(7))
                     and c.tolist() == list(range(5000)) and c2.tolist() == list(range(5000))
                     and d[-1] == 2499.5 and np.array_equal(d, e) and g.shape == (5000, 2))
del a, b, c, c2, d, e, f, g, s


# error paths: numpy frees our blocks with its exception pending; the
# exception must come out unchanged (not SystemError) and the block freed
def boom():
    yield 1.0
    yield 2.0
    raise KeyError("from the iterator")


errs = []
with A.using(h):
    for fn in (lambda: np.fromiter(boom(), dtype=np.float64),
               lambda: np.array([1.0, "x", 2.0], dtype=float),
               lambda: np.ones(10).reshape(3, 4)):
        try:
            fn()
            errs.append(None)
        except Exception as e:  # noqa: BLE001
            errs.append(type(e).__name__)
res["error_paths"] = errs

# an allocator that raises: MemoryError for numpy, the exception to sys.unraisablehook
seen = []
old_hook = sys.unraisablehook
# the allocator is the hook's object (3.10-3.12), or named at the end of
# err_msg with no object (3.13: "... ctypes callback function <capsan ...>")
sys.unraisablehook = lambda u: seen.append((
    type(u.exc_value).__name__, str(u.exc_value),
    repr(u.object) if u.object is not None else (u.err_msg or "").rpartition(" function ")[2]))


def flaky_malloc(n):
    if n == 8 * 1234:
        raise ZeroDivisionError("flaky")
    return s_malloc(n)


fl = A.allocator("flaky", malloc=flaky_malloc, calloc=s_calloc, realloc=s_realloc, free=s_free)
with A.using(fl):
    ok = np.empty(10)
    try:
        np.empty(1234)
        res["flaky"] = "no error"
    except MemoryError:
        res["flaky"] = "MemoryError"
sys.unraisablehook = old_hook
res["unraisable"] = seen
res["flaky_errors"] = A.handler_info(fl).errors
del ok, fl

# C functions: libc without ctx (through the drop-ctx thunk) and numpy's
# default handler's own functions, which take ctx
hc = A.allocator("libc_noctx", malloc=libc.malloc, calloc=libc.calloc, realloc=libc.realloc,
                 free=libc.free)
dflt = A.handler_struct(default).allocator
hn = A.allocator("nep_c", malloc=dflt.malloc, calloc=dflt.calloc, realloc=dflt.realloc,
                 free=dflt.free, ctx=dflt.ctx, takes_ctx=True)
with A.using(hc):
    x = np.arange(1000.0)
    x.resize(5000, refcheck=False)
    z = np.zeros(100)
with A.using(hn):
    y = np.arange(1000.0)
    y.resize(3, refcheck=False)
res["c_handlers"] = [name(x), name(z), name(y), A.handler_info(hc).kinds["malloc"],
                     A.handler_info(hn).kinds["malloc"], x[:1000].sum().item(), y.tolist()]
del x, y, z, hc, hn

# lifetime: the user drops the handler; it lives until its last array dies
lt = A.allocator("short_lived", malloc=s_malloc, calloc=s_calloc, realloc=s_realloc,
                 free=s_free)
lt_info = A.handler_info(lt)
with A.using(lt):
    keep = [np.full(100, i) for i in range(10)]
base_live = A.live_handlers()
del lt
gc.collect()
res["lifetime"] = {"alive_with_arrays": lt_info.alive, "names": name(keep[3]),
                   "sum": int(sum(k.sum() for k in keep))}
del keep
gc.collect()
res["lifetime"]["alive_after"] = lt_info.alive
res["lifetime"]["handlers_dropped"] = base_live - A.live_handlers()

# everything allocated through the secret allocator was freed through it
gc.collect()
res["calls"] = dict(info.calls)
res["secret_live"] = len(live)
res["stats"] = {k: (v if not isinstance(v, list) else len(v)) for k, v in st.items()}
res["mismatch_examples"] = st["size_mismatch"][:3]
print("RESULT " + json.dumps(res))
