"""An extension's zero-copy "flatten" that makes the view own its data
(np_foreign.flat_owner): the source array frees the block through its
memory handler when it dies, then numpy frees it again with libc free()
when the view dies (numpy-double-free; glibc aborts natively)."""
import numpy as np

import np_foreign as O


def load():
    grid = np.arange(512.0).reshape(16, 32)  # <-- alloc
    flat = O.flat_owner(grid)  # <-- wrap
    return grid, flat


grid, flat = load()
print("sum", flat.sum(), flush=True)
del grid  # <-- free
del flat  # <-- free-again
print("survived", flush=True)
