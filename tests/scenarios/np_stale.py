"""A NEP 49 handler destroyed while arrays still use it (numpy-stale-handler),
from the np_stalehandler extension.

argv[1]: struct (free the PyDataMem_Handler), ctx (free its ctx), swap
(overwrite its free function in place), two (free the struct while two
arrays use it: each block is stale from then on, and a free may crash),
crash (as two, and the first free through the dead handler dies of
SIGSEGV: both blocks must be on record before it).
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
    a2 = np.ones(1000) if what in ("two", "crash") else None  # <-- alloc2
    S.set_handler(old)
    S.destroy("struct" if what in ("two", "crash") else what)  # <-- destroy
    if what == "crash":
        S.crash_next_free()
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
