"""numpy 1.24 itself reaches its memory handler without the GIL:
fromfile(sep=...) grows its buffer with PyDataMem_UserRENEW inside
NPY_BEGIN_ALLOW_THREADS, so it reads the handler capsule and calls the
handler's realloc with the GIL released (the default handler asserts the
GIL, R33). lexsort's scratch buffer, also made without the GIL, comes from
the legacy PyDataMem_NEW, which calls no handler and is allowed there
(PyTraceMalloc_Track takes the GIL itself): no finding for it."""
import tempfile

import numpy as np

a = np.ones(100, dtype=np.int8)
b = np.ones(100, dtype=np.int32)
i = np.lexsort((a[::-1], b))
print("sorted", int(i[0]), int(i[-1]))

with tempfile.TemporaryFile(mode="w+") as f:
    f.write(",".join(str(k) for k in range(5000)))
    f.seek(0)
    x = np.fromfile(f, sep=",")  # <-- fromfile
print("read", x.size)
