"""fork() while another thread holds arrays and a consumed export: the
child has that thread's frames and what they hold, but not the thread
(CPython abandons its state), so at the child's normal exit they are held,
not leaked. The child's own leak is one."""
import os
import sys
import threading

import numpy as np

import dlconsumer as C

ready, stop = threading.Event(), threading.Event()


def hold():
    arrays = [np.ones(1000) for _ in range(2)]
    view = np.from_dlpack(np.ones(500))
    ready.set()
    stop.wait()


holder = threading.Thread(target=hold)
holder.start()
ready.wait()
pid = os.fork()
if pid == 0:
    C.consume_leak(np.ones(10).__dlpack__())  # <-- child-leak
    print("child", os.getpid(), flush=True)
    sys.exit(0)  # a normal exit: the verdict at exit
_, status = os.waitpid(pid, 0)
stop.set()
holder.join()
print("parent done", os.waitstatus_to_exitcode(status), flush=True)
