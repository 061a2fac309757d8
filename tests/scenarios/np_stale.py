"""A NEP 49 handler destroyed while arrays still use it (numpy-stale-handler),
from the np_stalehandler extension.

argv[1]: struct (free the PyDataMem_Handler), ctx (free its ctx), swap
(overwrite its free function in place), two (free the struct while two
arrays use it: each free is stale, and the second may crash).
argv[2]: "trace" to run it inside capsan.trace() and print its findings.
"""
import sys

import numpy as np

import np_stalehandler as S

what = sys.argv[1]
traced = len(sys.argv) > 2 and sys.argv[2] == "trace"
if traced:
    import capsan
    from np_common import emit


def run():
    old = S.install()  # <-- install
    a = np.ones(1000)  # <-- alloc
    a2 = np.ones(1000) if what == "two" else None  # <-- alloc2
    S.set_handler(old)
    S.destroy("struct" if what == "two" else what)  # <-- destroy
    del a  # <-- free
    del a2  # <-- free2
    b = np.ones(1000)  # a new array: the default handler again
    del b


if traced:
    with capsan.trace() as t:
        run()
    emit(t)
else:
    run()
print("survived", what, S.counts(), flush=True)
