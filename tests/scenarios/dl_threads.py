"""DLPack tensors that leave the thread that exported them.

capsan judges an exchange on its own thread while it lasts (export,
consume and delete on one thread: preload/dlpack/young_dl.c) and moves a tensor
to the shared lifecycle as soon as anything else concerns it. These
programs cross those lines.

argv[1]:
  pipeline  main thread and 3 workers exchange numpy <-> torch; a worker's
            torch tensors are dropped on the main thread, the main thread's
            on the workers; 64 tensors stay alive across the loop; the
            process forks in the middle (the child exchanges too): clean
  leak      (fixtures) a worker consumes a tensor, never releases it and
            ends: one
            dlpack-leak, exported and consumed on the worker's lines
  double    (fixtures) a worker's consumer releases a tensor twice, after
            many clean exchanges on that thread: one dlpack-double-delete
  mutated   (fixtures) the producer changes the loaned shape of a tensor
            consumed on the main thread, released on a worker: one
            dlpack-bad-tensor (R20), seen at the release
"""
import os
import queue
import sys
import threading

mode = sys.argv[1]

if mode == "pipeline":
    import numpy as np
    import torch

    N = 400
    to_main = queue.Queue()
    to_worker = [queue.Queue() for _ in range(3)]
    errors = []

    def exchange(k, i):
        a = np.full(8, k * 100000 + i, dtype=np.int64)
        t = torch.from_dlpack(a)         # numpy -> torch
        b = np.from_dlpack(t * 1)        # torch -> numpy
        if int(b[0]) != k * 100000 + i:
            errors.append((k, i))
        return t, b

    def worker(k):
        try:
            for i in range(N):
                t, b = exchange(k, i)
                to_main.put((t, b))      # dropped on the main thread
                try:
                    while True:          # the main thread's, dropped here
                        to_worker[k].get_nowait()
                except queue.Empty:
                    pass
        except Exception as e:  # noqa: BLE001
            errors.append(repr(e))

    kept = []
    ths = [threading.Thread(target=worker, args=(k,)) for k in range(3)]
    for th in ths:
        th.start()
    for i in range(N):
        t, b = exchange(9, i)
        if i % 5 == 0 and len(kept) < 64:
            kept.append((t, b))          # alive past many younger exchanges
        else:
            to_worker[i % 3].put((t, b))
        try:
            while True:
                to_main.get_nowait()
        except queue.Empty:
            pass
        if i == N // 2:
            pid = os.fork()
            if pid == 0:                 # the child exchanges on its own
                for j in range(50):
                    exchange(7, j)
                kept.clear()
                sys.stdout.flush()
                os._exit(0 if not errors else 3)
            _, st = os.waitpid(pid, 0)
            if st != 0:
                errors.append(("child", st))
    for th in ths:
        th.join()
    kept.clear()
    while not to_main.empty():
        to_main.get()
    for q in to_worker:
        while not q.empty():
            q.get()
    assert not errors, errors[:5]
    print("survived pipeline", flush=True)

else:
    import dlconsumer as C
    import dlproducer as P

    def clean(n):
        for _ in range(n):
            C.consume_good(P.good(8))

    if mode == "leak":
        def leaky():
            clean(100)
            cap = P.good(8)  # <-- leak-export
            C.consume_leak(cap)  # <-- leak-consume
            clean(100)
        th = threading.Thread(target=leaky)
        th.start()
        th.join()
        clean(100)
        print("survived leak", flush=True)
    elif mode == "double":
        def twice():
            clean(200)
            C.double_delete(P.good(8))  # <-- double
            clean(200)
        th = threading.Thread(target=twice)
        th.start()
        th.join()
        print("survived double", P.deleted_count(), flush=True)
    elif mode == "mutated":
        cap = P.loaned(8)  # <-- mutated-export
        C.consume_hold(cap)  # consumed on the main thread
        clean(100)
        P.shrink_loaned()  # the producer changes what it lent
        th = threading.Thread(target=C.release_holds)  # <-- mutated-release
        th.start()
        th.join()
        print("survived mutated", flush=True)
