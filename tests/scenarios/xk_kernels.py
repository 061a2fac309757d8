"""Kernels that take and return torch tensors through DLPack 1.3's exchange
table (tests/fixtures/xkernel.c), one bug a kernel author makes per mode.

    python xk_kernels.py MODE [N]

clean, leak, double_delete, nogil, bad_tensor, stale_view, data_freed,
deleter_nogil. Prints "ok" when the program got to its end."""
import sys
import threading

import torch

import xkernel

mode = sys.argv[1]
n = int(sys.argv[2]) if len(sys.argv) > 2 else 3


def x():
    return torch.arange(12, dtype=torch.float32).reshape(3, 4)


if mode == "clean":
    def work():
        for _ in range(n):
            t = x()
            y = xkernel.scale(t, 2.0)
            assert float(y.sum()) == 2 * float(t.sum())
            assert xkernel.total(t) == float(t.sum())
            assert xkernel.view_total(t) == float(t.sum())
            z = torch.from_dlpack(y)
            del y, z
            xkernel.hold(t)
            assert xkernel.run_held() == float(t.sum())
    work()
    ts = [threading.Thread(target=work) for _ in range(3)]
    for th in ts:
        th.start()
    for th in ts:
        th.join()
elif mode == "leak":
    keep = [x() for _ in range(3)]
    for t in keep:
        xkernel.total_leaky(t)  # <-- leak
elif mode == "double_delete":
    y = xkernel.scale_double(x(), 3.0)  # <-- handed
    del y  # <-- dropped
elif mode == "nogil":
    xkernel.total_nogil(x())  # <-- nogil
elif mode == "bad_tensor":
    y = xkernel.scale_nostrides(x(), 2.0)  # <-- nostrides
    del y
elif mode == "stale_view":
    big = torch.ones(1 << 16, dtype=torch.float32)
    lst = [big]
    del big
    xkernel.view_after_drop(lst)  # <-- stale
elif mode == "view_clean":
    # views end when their call returns: the tensor freed afterwards is fine
    for _ in range(n):
        big = torch.ones(1 << 16, dtype=torch.float32)
        xkernel.view_total(big)
        del big
elif mode == "data_freed":
    t = torch.ones(256, dtype=torch.float32)
    xkernel.hold(t)  # <-- held
    t.resize_(1 << 16)  # <-- resized
    xkernel.run_held()
elif mode == "deleter_nogil":
    y = xkernel.alias(x())  # <-- alias

    def drop(box):
        box.pop()  # <-- worker-drops

    box = [y]
    del y
    th = threading.Thread(target=drop, args=(box,))
    th.start()
    th.join()
else:
    raise SystemExit(f"unknown mode {mode}")
print("ok")
