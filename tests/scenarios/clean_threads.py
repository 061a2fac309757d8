"""4 threads exchanging tensors concurrently (numpy -> torch -> numpy).
argv[1]: exchanges per thread (default 2000). torch releases foreign
tensors without the GIL, from whichever thread drops them."""
import sys
import threading

import numpy as np
import torch

N = int(sys.argv[1]) if len(sys.argv) > 1 else 2000
errors = []
shared = []
lock = threading.Lock()


def worker(k):
    try:
        for i in range(N):
            a = np.full(8, k * 100000 + i, dtype=np.int64)
            t = torch.from_dlpack(a)
            b = np.from_dlpack(t * 1)  # a torch-owned tensor exported back
            if int(b[0]) != k * 100000 + i:
                errors.append((k, i))
            if i % 97 == 0:
                with lock:  # hand some tensors to other threads to release
                    shared.append(t)
                    if len(shared) > 8:
                        shared.pop(0)
    except Exception as e:  # noqa: BLE001
        errors.append(repr(e))


ths = [threading.Thread(target=worker, args=(k,)) for k in range(4)]
for th in ths:
    th.start()
for th in ths:
    th.join()
shared.clear()
assert not errors, errors[:5]
print("threads done", 4 * N)
