"""NumPy blocks that do not stay on the thread that made them: a pipeline
whose workers make arrays the main thread frees and the other way round,
with hundreds alive at once, arrays grown in place, a fork in the middle;
and the bugs such a program can hide (np_leaky, np_foreign extensions).

argv[1]:
  pipeline   clean: 4 workers and the main thread hand 4,000 arrays both
             ways through queues (up to 600 alive at once), 200 long-lived
             arrays are grown in place, a forked child frees what it
             inherited; nothing leaks
  leak       the same pipeline, and one worker's array handed to
             keep_forever() (INCREF'd and kept in C): one numpy-leak, made on
             that worker's line
  forks      clean: 3 workers make and free arrays without pause (each
             holding a few alive) while the main thread forks 20 children,
             each of which makes and frees arrays of its own and exits; no
             hang, nothing leaks in any process
  double     a worker frees an array's data with PyDataMem_FREE, keeping
             OWNDATA, and hands the array to the main thread, whose numpy
             frees it again (glibc aborts): numpy-double-free, the first free
             on the worker's line and the second on the main thread's
"""
import os
import queue
import sys
import threading

import numpy as np

mode = sys.argv[1]
N_WORKERS, PER_WORKER = 4, 500


def worker(i, out, back, done):
    made = []
    for k in range(PER_WORKER):
        a = np.full(16 + (k % 64), float(i))  # <-- worker-made
        out.put(a)
        made.append(a)
        if len(made) > 150:  # many alive on this thread at once
            del made[:100]
        try:  # arrays the main thread made die here
            while True:
                b = back.get_nowait()
                assert b[0] == -1.0
                del b
        except queue.Empty:
            pass
    del made
    done.set()


def pipeline(leak=False):
    out, back = queue.Queue(), queue.Queue()
    dones = [threading.Event() for _ in range(N_WORKERS)]
    ts = [threading.Thread(target=worker, args=(i, out, back, dones[i])) for i in range(N_WORKERS)]
    for t in ts:
        t.start()
    kept = [np.arange(32.0) for _ in range(200)]  # long-lived: they leave the main thread's table
    got = 0
    while got < N_WORKERS * PER_WORKER:
        a = out.get()
        got += 1
        back.put(np.full(8, -1.0))  # the main thread's arrays, freed by the workers
        if leak and got == 1234:
            import np_leaky as L
            L.keep_forever(a)
        del a  # a worker's array dies on the main thread
        if got % 10 == 0:
            k = kept[got // 10 % 200]
            k.resize(64 if k.size == 32 else 32, refcheck=False)  # realloc, often in place
    for t in ts:
        t.join()
    pid = os.fork()
    if pid == 0:  # the child frees what it inherited
        del kept[:]
        os._exit(0)
    _, st = os.waitpid(pid, 0)
    assert os.WIFEXITED(st) and os.WEXITSTATUS(st) == 0, st
    while not back.empty():
        back.get()
    del kept


def double():
    import np_foreign as O
    handed = queue.Queue()

    def first():
        a = np.arange(128, dtype=np.float64)  # <-- alloc-double
        O.free_twice(a)  # <-- free-first
        handed.put(a)

    t = threading.Thread(target=first)
    t.start()
    t.join()
    a = handed.get()
    del a  # <-- free-again


def forks():
    stop = threading.Event()

    def churn(i):
        held = []
        while not stop.is_set():
            held.append(np.full(32 + i, float(i)))
            if len(held) > 5:
                held.pop(0)

    ts = [threading.Thread(target=churn, args=(i,)) for i in range(3)]
    for t in ts:
        t.start()
    for _ in range(20):
        pid = os.fork()
        if pid == 0:  # a child: the other threads did not come along
            xs = [np.arange(100.0) * k for k in range(50)]
            del xs
            os._exit(0)
        _, st = os.waitpid(pid, 0)
        assert os.WIFEXITED(st) and os.WEXITSTATUS(st) == 0, st
    stop.set()
    for t in ts:
        t.join()


if mode == "pipeline":
    pipeline()
elif mode == "leak":
    pipeline(leak=True)
elif mode == "forks":
    forks()
elif mode == "double":
    double()
print("survived", mode, flush=True)
