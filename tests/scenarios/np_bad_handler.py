"""Invalid NEP 49 handlers installed with PyDataMem_SetHandler
(numpy-bad-handler), from the np_badhandler extension; numpy 1.24 accepts
them all.

argv[1]:
  v2            version 2: numpy allocates through it anyway
  misnamed      a capsule named "mem_handler_v1": numpy 1.24 takes it and the
                next allocation fails (MemoryError with a SystemError chained,
                numpy #26137); numpy >= 2.1 refuses it with ValueError, so
                nothing is installed
  null_free     free == NULL: restored before any array could be freed by it
  unterminated  a 127-byte name with no NUL
argv[2]: "trace" to run it inside capsan.trace() and print its findings.
"""
import sys

import numpy as np

import np_badhandler as B

mode = sys.argv[1]
traced = len(sys.argv) > 2 and sys.argv[2] == "trace"
from np_common import multiarray, run_mode  # noqa: E402


def v2():
    old = B.install_v2()  # <-- install-v2
    a = np.arange(100.0)
    assert multiarray().get_handler_version(a) == 2
    del a
    B.set_handler(old)


def misnamed():
    try:
        old = B.install_misnamed()  # <-- install-misnamed
    except ValueError as e:  # numpy >= 2.1 checks the name itself
        print("refused", type(e).__name__, e, flush=True)
        return
    try:
        np.empty(100)
    except MemoryError as e:
        print("MemoryError", type(e.__cause__ or e.__context__).__name__, flush=True)
    else:
        print("allocation succeeded", flush=True)
    finally:
        B.set_handler(old)


def null_free():
    old = B.install_null_free()  # <-- install-null-free
    B.set_handler(old)


def unterminated():
    old = B.install_unterminated()  # <-- install-unterminated
    B.set_handler(old)


run_mode({"v2": v2, "misnamed": misnamed, "null_free": null_free, "unterminated": unterminated}, mode, traced)
