"""A parent and a forked child both exchange tensors; each process must
write its own (clean) trace. The child exits normally (not os._exit)."""
import os
import sys

import numpy as np
import torch


def exchange(tag, n):
    for i in range(n):
        a = np.arange(16, dtype=np.float32) + i
        t = torch.from_dlpack(a)
        b = np.from_dlpack(t.clone())
        assert float(b[0]) == float(i)
    print(tag, "exchanged", n, flush=True)


exchange("parent-before", 50)
pid = os.fork()
if pid == 0:
    exchange("child", 200)
    sys.exit(0)
exchange("parent-after", 200)
_, status = os.waitpid(pid, 0)
print("child status", os.waitstatus_to_exitcode(status), "child pid", pid, flush=True)
