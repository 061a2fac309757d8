"""A multiprocessing program: each worker process reads a batch from a C
producer (dlproducer, whose tensors are malloc'd) through a C consumer
(dlconsumer) and sends the sum back; the workers also make NumPy arrays.
One version of the consumer forgets to release one batch's tensor.

argv[1]: the start method, "fork" (workers end with os._exit, as every
         multiprocessing fork child does) or "spawn" (a new interpreter that
         exits normally)
argv[2]: "leak" (worker 2's three batches are consumed and never released)
         or "clean"
"""
import multiprocessing as mp
import sys

import numpy as np

import dlconsumer as C
import dlproducer as P

method, mode = sys.argv[1], sys.argv[2]


def work(i, q):
    batch = np.full(8, float(i), dtype=np.float32)
    if mode == "leak" and i == 2:
        for _ in range(3):
            C.consume_leak(P.good(8))  # <-- consume-leak
    else:
        C.consume_good(P.good(8))
        C.consume_good(batch.__dlpack__())
    kept = np.arange(100.0)  # alive when the worker ends: live, not leaked
    q.put((i, float(batch.sum()) + float(kept[0])))


if __name__ == "__main__":
    ctx = mp.get_context(method)
    q = ctx.Queue()
    procs = [ctx.Process(target=work, args=(i, q)) for i in range(4)]
    for p in procs:
        p.start()
    got = sorted(q.get(timeout=60) for _ in procs)
    for p in procs:
        p.join(60)
    print("results", got, flush=True)
    print("exitcodes", [p.exitcode for p in procs], flush=True)
