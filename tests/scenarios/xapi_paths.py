"""Ownership paths of DLPack 1.3's exchange API that cross into other
protocols or threads (issue 37 paths 1, 2, 7), committed by xkernel.c's
kernels on a table's tensors: torch's (torch) or xproducer's Blob (blob).

    python xapi_paths.py MODE PROVIDER [N]

lend_clean, lend_unchecked, view_thread, view_thread_clean, kept_view,
kept_view_heap, kept_clean. Prints "ok" when the program got to its end."""
import sys
import threading

import numpy as np

import xkernel

mode, provider = sys.argv[1], sys.argv[2]
n = int(sys.argv[3]) if len(sys.argv) > 3 else 3

if provider == "torch":
    import torch

    def x(k=64):
        return torch.arange(k, dtype=torch.float32)
else:
    import xproducer

    def x(k=64):
        return xproducer.Blob(k)


def total(k=64):
    return float(k * (k - 1) // 2)


class Lent:
    """What a library hands on: an object whose __dlpack__ gives the
    capsule a kernel made."""

    def __init__(self, cap):
        self.cap = cap

    def __dlpack__(self, stream=None, max_version=None, dl_device=None, copy=None):
        cap, self.cap = self.cap, None
        return cap

    def __dlpack_device__(self):
        return (1, 0)


def in_other_thread(fn):
    th = threading.Thread(target=fn)
    th.start()
    return th


if mode == "lend_clean":
    for _ in range(n):
        t = x()
        a = np.from_dlpack(Lent(xkernel.lend(t)))  # consumed by numpy
        assert float(a.sum()) == total()
        del a
        if provider == "torch":
            z = torch.from_dlpack(Lent(xkernel.lend(t)))  # consumed by torch
            assert float(z.sum()) == total()
            del z
        cap = xkernel.lend(t)
        del cap  # dropped unconsumed: its destructor deletes the tensor
        del t
elif mode == "lend_unchecked":
    t = x()
    # numpy consumes the capsule and drops it: its destructor deletes anyway
    a = np.from_dlpack(Lent(xkernel.lend_unchecked(t)))  # <-- unchecked
    assert float(a.sum()) == total()
    del a
elif mode == "view_thread":
    box = [x()]

    def drop():
        xkernel.wait_started()
        box.clear()  # <-- other-frees
        xkernel.resume()

    th = in_other_thread(drop)
    xkernel.view_total_unlocked(box)  # <-- unlocked
    th.join()
elif mode == "view_thread_clean":
    for _ in range(n):
        # the caller holds the tensor while the call runs: the drop frees nothing
        box = [x()]
        t = box[0]

        def drop():
            xkernel.wait_started()
            box.clear()
            xkernel.resume()

        th = in_other_thread(drop)
        assert xkernel.view_total_released(t) == total()
        th.join()
        del t
        # freed on another thread after the view's call returned, while this
        # thread waits in another call
        box = [x()]
        assert xkernel.view_total(box[0]) == total()

        def drop_later():
            xkernel.wait_started()
            box.clear()
            xkernel.resume()

        th = in_other_thread(drop_later)
        xkernel.pause()
        th.join()
elif mode == "kept_view":
    t = x()
    xkernel.keep_view(t)  # <-- kept
    assert xkernel.kept_total() == total()
    del t  # <-- owner-dies
elif mode == "kept_view_heap":
    t = x()
    xkernel.keep_view_heap(t)  # <-- kept-heap
    assert xkernel.kept_total() == total()
    del t  # <-- owner-dies-heap
elif mode == "kept_clean":
    for _ in range(n):
        t = x()
        xkernel.keep_view(t)
        assert xkernel.kept_total() == total()
        xkernel.forget_view()  # overwritten before its owner dies
        del t
        t = x()
        xkernel.keep_view_heap(t)
        assert xkernel.kept_total() == total()
        xkernel.forget_view()  # its heap struct freed before its owner dies
        del t
        t = x()
        assert xkernel.view_total(t) == total()  # a view on a stack that returned
        del t
else:
    raise SystemExit(f"unknown mode {mode}")
print("ok")
