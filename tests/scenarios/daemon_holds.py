"""A daemon thread still holds its arrays and a consumed export when the
program exits: CPython's finalization ends that thread (pthread_exit) and
abandons its frames, so what they hold is never freed -- held, not
leaked. The main thread's own leak and that of a thread that finished
are leaks as always."""
import threading
import time

import numpy as np

import dlconsumer as C

ready = threading.Event()


def hold():
    arrays = [np.ones(1000) for _ in range(3)]  # held by the daemon thread
    view = np.from_dlpack(np.ones(500))  # an export consumed there, held by its array
    ready.set()
    while True:
        time.sleep(0.01)


threading.Thread(target=hold, daemon=True).start()
ready.wait()
C.consume_leak(np.ones(10).__dlpack__())  # <-- main-leak
worker = threading.Thread(target=lambda: C.consume_leak(np.ones(20).__dlpack__()))  # <-- finished-leak
worker.start()
worker.join()
print("done", flush=True)
