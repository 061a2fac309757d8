"""70 capsules, each with a destructor of its own (ctypes closures): more
distinct destructors than capsan has stubs (64), so the last ones keep their
own destructor and are not followed. Every destructor must still run once,
the original destructor must be what PyCapsule_GetDestructor shows, and
half of them are consumed by torch, half die unconsumed."""
import ctypes

import numpy as np
import torch

import capsan
import capsan.dlpack as D

N = 70
ran = []
dtors = []
api = ctypes.pythonapi
api.PyCapsule_GetDestructor.restype = ctypes.c_void_p
api.PyCapsule_GetDestructor.argtypes = [ctypes.py_object]


def make(k):
    def dtor(cap):
        ran.append(k)
        D._capsule_destructor_impl(cap)
    cb = D.PyCapsule_Destructor(dtor)
    dtors.append(cb)
    addr = ctypes.cast(cb, ctypes.c_void_p).value
    buf = np.full(4, k, dtype=np.float32)
    cap = D._Capsule_New(D.to_managed(buf), D._NAME_ADDR[D.CAPSULE_NAME], addr)
    assert api.PyCapsule_GetDestructor(cap) == addr, (k, api.PyCapsule_GetDestructor(cap), addr)
    return cap


wrapped = []
for k in range(N):
    cap = make(k)
    wrapped.append(capsan.describe(cap)["wrapped_by_capsan"])
    if k % 2:
        t = torch.from_dlpack(cap)
        assert t.tolist() == [k] * 4
        del t
    del cap

assert sorted(ran) == list(range(N)), ran
# the first destructors got stubs, the last ones (past 64) kept their own
assert wrapped[0] and not wrapped[-1] and sum(wrapped) <= 64, wrapped
assert wrapped == sorted(wrapped, reverse=True), wrapped
st = D.stats()
assert st["exported"] == N and st["deleted"] == N and st["live"] == 0, st
print("destructors ok", N)
