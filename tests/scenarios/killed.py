"""A process that is SIGKILLed (by the OOM killer or its supervisor, here by
itself): no END record, no leak verdict, but the trace's live state says
what it held.

argv[1]:
  leak   a consumer never releases a numpy export, then SIGKILL: the tensor
         is a dlpack-leak warning (not released when killed)
  clean  torch holds a tensor made from a numpy array (a correct program),
         then SIGKILL: warnings only, no error
  fork   the parent holds a numpy view of a numpy export; a forked child
         leaks a tensor of its own and is SIGKILLed: the child's trace
         starts with what it inherited, and its warnings are its own
"""
import os
import signal
import sys

import numpy as np

mode = sys.argv[1]
if mode == "leak":
    import dlconsumer as C
    frame = np.arange(8, dtype=np.float32)  # <-- alloc
    C.consume_leak(frame.__dlpack__())  # <-- consume-leak
    del frame
elif mode == "clean":
    import torch
    held = torch.from_dlpack(np.arange(16, dtype=np.float32))  # <-- held
else:
    import dlconsumer as C
    view = np.from_dlpack(np.arange(4.0))  # <-- parent-view
    pid = os.fork()
    if pid:
        _, st = os.waitpid(pid, 0)
        print("child", pid, "signal", os.WTERMSIG(st), flush=True)
        sys.exit(0)
    C.consume_leak(np.arange(8, dtype=np.float32).__dlpack__())  # <-- child-leak
print("killing", mode, flush=True)
os.kill(os.getpid(), signal.SIGKILL)
