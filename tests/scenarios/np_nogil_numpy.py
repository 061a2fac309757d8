"""numpy 1.24 itself reaches its memory handler without the GIL: lexsort of
mixed-dtype keys with a non-contiguous one allocates its buffer inside
NPY_BEGIN_THREADS (the default handler asserts the GIL, R33)."""
import numpy as np

a = np.ones(100, dtype=np.int8)
b = np.ones(100, dtype=np.int32)
i = np.lexsort((a[::-1], b))  # <-- lexsort
print("sorted", int(i[0]), int(i[-1]))
