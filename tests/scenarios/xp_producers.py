"""A producer's exchange table with the bugs producers ship
(tests/fixtures/xproducer.c), used by the kernels of xkernel.c.

    python xp_producers.py MODE

clean, null_deleter, from_py_no_error, alloc_no_seterror, heap_table.
Prints "ok" when the program got to its end."""
import sys

import xkernel
import xproducer

mode = sys.argv[1]

if mode == "clean":
    for _ in range(3):
        b = xproducer.Blob(6)
        assert xkernel.total(b) == 15.0
        assert xkernel.view_total(b) == 15.0
        y = xkernel.scale(b, 2.0)  # allocated by xproducer, returned as a Blob
        assert type(y) is xproducer.Blob and y.sum() == 30.0
        del y
elif mode == "null_deleter":
    c = xproducer.Blob(4, const=True)
    xkernel.total(c)  # <-- null-call
elif mode == "from_py_no_error":
    xproducer.set_bug("from_py_no_error")
    try:
        xkernel.total(xproducer.Blob(4))  # <-- no-error
    except SystemError:
        pass
elif mode == "alloc_no_seterror":
    xproducer.set_bug("alloc_no_seterror")
    try:
        xkernel.scale(xproducer.Blob(4), 2.0)  # <-- no-seterror
    except SystemError:
        pass
elif mode == "heap_table":
    assert xkernel.total(xproducer.HeapBlob(4)) == 6.0  # <-- heap-table
else:
    raise SystemExit(f"unknown mode {mode}")
print("ok")
