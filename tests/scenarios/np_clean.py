"""Correct NumPy memory traffic: must give ZERO findings, under
capsan.trace() (argv[1] == "trace": every section in its own trace scope)
and under `capsan run` for the whole run (argv[1] == "run").

Sections:
  aligned  a correct 64-byte-aligned NEP 49 handler installed by the user
           (np_aligned); the tracing handler wraps it and forwards to it
  threads  4 threads creating, sharing and freeing arrays
  asyncio  tasks creating arrays (they inherit the context's handler)
  views    views, views of views, ndarray subclass chains, base dying first
  ops      np.resize / ndarray.resize (incl. resize(0): numpy frees with a
           wrong size), np.sort (free(NULL, n)), np.fromiter (realloc),
           pickling (__setstate__), concatenate, temporaries
  voids    void scalars: numpy 1.24 takes their bytes from its small-block
           cache through the legacy PyDataMem_NEW/FREE (no handler), the
           same cache the default handler's small blocks go through; up to
           7 blocks per size are still in that cache at exit
"""
import asyncio
import pickle
import sys
import threading

import numpy as np

import np_aligned as A
from np_common import multiarray

mode = sys.argv[1] if len(sys.argv) > 1 else "run"
only = sys.argv[2:] or ["aligned", "threads", "asyncio", "views", "ops", "voids"]
handler_name = multiarray().get_handler_name


def in_scope(traced, run):
    """run() in a trace scope of its own (kept in `scopes`), or plainly."""
    if traced:
        with capsan.trace() as t:
            run()
        scopes.append(t)
    else:
        run()


def work(n=50):
    s = 0.0
    for i in range(n):
        a = np.arange(i + 1, dtype=np.float64)
        b = (a * 2 + 1)[::2]
        c = np.concatenate([a, b]).reshape(-1, 1)
        s += float(c.sum())
    return s


def aligned_section(traced):
    old = A.install()
    try:
        before = A.stats()
        if traced:
            with capsan.trace() as t:
                assert handler_name() == "capsan(aligned64_allocator)", handler_name()
                a = np.ones(1000)
                assert A.aligned(a), "the tracing handler did not forward to the aligned one"
                del a
                work()
            scopes.append(t)
            # an explicit inner handler, installed over numpy's default
            A.set_handler(None)
            with capsan.trace(inner=A.handler()) as t2:
                b = np.zeros(333)
                assert A.aligned(b)
                del b
            scopes.append(t2)
        else:
            a = np.ones(1000)
            assert A.aligned(a)
            del a
            work()
        after = A.stats()
        assert after[0] > before[0], (before, after)
        assert after[2] == before[2], f"aligned blocks left alive: {before} -> {after}"
        assert after[3] == 0, after
    finally:
        A.set_handler(old)


def threads_section(traced):
    errors, shared, lock = [], [], threading.Lock()
    made, cleared = threading.Barrier(4, timeout=60), threading.Barrier(4, timeout=60)

    def body(k):
        for i in range(500):
            a = np.full(16 + (i % 64), k, dtype=np.int64)
            if a[0] != k:
                errors.append((k, i))
            if i % 50 == 0:
                with lock:
                    shared.append(a)
                    if len(shared) > 6:
                        shared.pop(0)
        made.wait()
        if k == 0:
            with lock:
                shared.clear()  # frees blocks the other threads made
        cleared.wait()

    def worker(k):
        try:
            if traced:
                # a new thread starts with numpy's default handler, not the
                # one of the scope that started it: each opens its own
                with capsan.trace() as t:
                    assert handler_name().startswith("capsan("), handler_name()
                    body(k)
                with lock:
                    scopes.append(t)
            else:
                body(k)
        except Exception as e:  # noqa: BLE001
            errors.append(repr(e))

    def run():
        ths = [threading.Thread(target=worker, args=(k,)) for k in range(4)]
        for th in ths:
            th.start()
        for th in ths:
            th.join()

    in_scope(traced, run)
    assert not errors, errors[:3]
    assert not traced or len(scopes) >= 4, "the workers' scopes were not kept"


def asyncio_section(traced):
    expect = handler_name()

    async def task(k):
        await asyncio.sleep(0)
        assert handler_name() == expect, (handler_name(), expect)
        a = np.arange(100 * (k + 1))
        await asyncio.sleep(0)
        return int(a.sum())

    async def main():
        return await asyncio.gather(*(task(k) for k in range(8)))

    if traced:
        with capsan.trace() as t:
            expect = handler_name()
            assert expect.startswith("capsan("), expect
            res = asyncio.run(main())
        scopes.append(t)
    else:
        res = asyncio.run(main())
    assert res[0] == 4950, res


class MyArr(np.ndarray):
    pass


class Sub2(MyArr):
    pass


def views_section(traced):
    def run():
        a = np.arange(10).view(MyArr).reshape((2, 5))
        assert handler_name(a) is None and not a.flags.owndata
        assert handler_name(a.base.base) is not None and a.base.base.flags.owndata
        b = a[:, 1:].view(Sub2)
        c = b.T
        del a, b  # the owner dies after its views
        assert c.sum() == 40
        d = np.ones((4, 4))[1:3, 1:3]
        e = np.asarray(d).view(MyArr)
        del d
        assert e.sum() == 4
        f = np.empty(0).view(MyArr)  # a 0-byte array still owns a 1-byte block
        del c, e, f

    in_scope(traced, run)


def ops_section(traced):
    def run():
        a = np.arange(100.0)
        r = np.resize(a, (250,))
        assert r.shape == (250,)
        r0 = np.resize(a, 0)
        assert r0.size == 0
        b = np.arange(10.0)
        b.resize(0, refcheck=False)  # numpy reallocates to 1 byte, frees with another size
        c = np.arange(10.0)
        c.resize((1000,), refcheck=False)
        s = np.sort(np.arange(10)[::-1])  # sort's scratch buffer: free(NULL, n)
        s2 = np.sort(np.random.default_rng(0).random(5000), kind="mergesort")
        g = np.fromiter((i * i for i in range(5000)), dtype=np.int64)  # grows by realloc
        g2 = np.fromiter(range(7), dtype=np.float32, count=7)
        p = pickle.loads(pickle.dumps(np.arange(64.0).reshape(8, 8)))
        q = np.empty(0)
        q.__setstate__((1, (4,), np.dtype("f8"), False, b"\0" * 32))  # frees, then allocates
        t = np.frombuffer(b"abcdefgh", dtype=np.uint8).copy()
        assert s[0] == 0 and s2[0] <= s2[1] and g[-1] == 4999 ** 2 and p.shape == (8, 8)
        del a, r, r0, b, c, s, s2, g, g2, p, q, t
        work()

    in_scope(traced, run)


def voids_section(traced):
    """numpy 1.24 allocates a void scalar's bytes with the legacy
    PyDataMem_NEW (no handler) and frees them into its small-block cache
    (up to 7 per size) when there is room; the default handler later takes
    them out of that cache. The run ends with the cache full of them."""
    sizes = (1, 2, 3, 12)
    fill = 7

    def voids(n, k, byte=b"v"):
        return [np.void(byte * n) for _ in range(k)]

    def run():
        for n in sizes:
            drain = [np.empty(n, np.uint8) for _ in range(2 * fill)]  # empties the cache
            v = voids(n, 3 * fill)
            assert all(bytes(x) == b"v" * n for x in v)
            del v  # 7 into the cache, the rest freed
            a = [np.empty(n, np.uint8) for _ in range(fill)]  # the default handler takes them
            del a, drain  # the handler's blocks fill the cache
            v = voids(n, 3 * fill, b"w")
            del v  # cache full: all freed
            drain = [np.empty(n, np.uint8) for _ in range(2 * fill)]
            v = voids(n, fill, b"x")
            del v  # into the cache, which keeps them to the end
            del drain

    in_scope(traced, run)


scopes = []
traced = mode == "trace"
if traced:
    import capsan
for name in only:
    globals()[name + "_section"](traced)
    print("section", name, "ok", flush=True)

if traced:
    from np_common import emit

    class _All:  # every scope's findings, as one list
        findings = [f for t in scopes for f in t.findings]
    emit(_All)
print("done", flush=True)
