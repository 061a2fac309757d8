"""A NEP 49 handler re-pointed in place (np_pools): its "switch pools" API
changes the handler's ctx, or its functions, while arrays it allocated are
alive, and numpy frees them through what the handler says at the free
(numpy-stale-handler). The pool statistics show the damage natively.

argv[1]:
  live     an array made in pool pageable, the handler switched to pinned,
           the array freed: pinned is charged for pageable's block (bug)
  back     switched to pinned, an array made there, switched back to
           pageable, that array freed through pageable (bug)
  funcs    an array made, the functions re-pointed to another set (bug)
  idle     the same switches with no array alive across them (clean)
  same     the functions "re-pointed" to the very same pointers (clean)
"""
import sys

import numpy as np

import np_pools as P

what = sys.argv[1]
old = P.install()
if what == "live":
    a = np.ones(1000)  # <-- alloc-live
    P.use("pinned")  # <-- switch-live
    del a  # <-- free-live
elif what == "back":
    P.use("pinned")
    b = np.ones(1000)  # <-- alloc-back
    P.use("pageable")  # <-- switch-back
    del b  # <-- free-back
elif what == "funcs":
    a = np.ones(1000)  # <-- alloc-funcs
    P.use_functions("zeroing")  # <-- switch-funcs
    del a  # <-- free-funcs
elif what == "idle":
    a = np.ones(1000)
    del a
    P.use("pinned")
    b = np.ones(1000)
    del b
    P.use("pageable")
    P.use_functions("zeroing")
    c = np.ones(1000)
    del c
elif what == "same":
    a = np.ones(1000)
    P.use_functions("same")
    del a
P.set_handler(old)
print("stats", sorted(P.stats().items()), flush=True)
