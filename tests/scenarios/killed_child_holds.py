"""A forked child holds an exported tensor and a NumPy array when its
parent ends it with SIGTERM (multiprocessing's terminate() does so): no
handler of capsan's sees that signal, so the child leaves its trace
without an END and prints nothing. The parent is clean."""
import os
import signal
import time

import numpy as np

r, w = os.pipe()
pid = os.fork()
if pid == 0:
    keep = np.ones(100)  # <-- child-array
    cap = np.ones(10).__dlpack__()  # <-- child-export
    os.write(w, b"x")
    time.sleep(60)
    os._exit(0)
os.read(r, 1)
os.kill(pid, signal.SIGTERM)
os.waitpid(pid, 0)
print("parent done", pid, flush=True)
