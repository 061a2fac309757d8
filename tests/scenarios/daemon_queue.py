"""A worker pipeline whose daemon thread only receives its arrays: the
main thread makes them and hands them over through a queue. When the
program exits, the worker is blocked holding its batch, and two more
arrays wait in the queue it holds: CPython abandons its frames, so none of
them is ever freed -- held, not leaked, though the worker made no event on
them. The main thread's own lost reference is a leak as always."""
import ctypes
import queue
import threading

import numpy as np

batch_full = threading.Event()
stop = threading.Event()


def worker(q):
    batch = []
    while len(batch) < 3:
        item = q.get()
        batch.append(item)  # the last item is also the local `item`
    batch_full.set()
    stop.wait()  # never set: blocked, with batch and q, at exit


q = queue.Queue()
threading.Thread(target=worker, args=(q,), daemon=True).start()
for i in range(3):
    q.put(np.ones(1000 + i))
batch_full.wait()
q.put(np.zeros(50))  # pending in the worker's queue at exit
q.put(np.zeros(60)[::2])  # a view: its base holds the block
q.put(np.from_dlpack(np.ones(70)))  # an imported array: it holds a consumed tensor
lost = np.ones(7)  # <-- main-leak
ctypes.pythonapi.Py_IncRef(ctypes.py_object(lost))  # a reference lost, as a buggy extension does
del lost, q
print("done", flush=True)
