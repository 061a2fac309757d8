"""onnxruntime's OrtValueVector.to_dlpacks(to_tensor) lends each OrtValue
to the callback in one "dltensor" capsule without a destructor, made once
and re-armed for each tensor (PyCapsule_SetName back to "dltensor", then
PyCapsule_SetPointer). When the callback raises, to_dlpacks throws at once:
its reference to the capsule is never dropped, and the DLManagedTensor in
it, holding the OrtValue and so its buffer, is never released
(onnxruntime 1.23.2 through 1.32.0).

argv[1]:
  "fail": the callback refuses the third tensor (the queue is full): the
          capsule and its tensor leak (dlpack-leak at the to_dlpacks line)
  "ok":   the callback takes all three (numpy consumes each): nothing leaks
"""
import sys

import numpy as np
import onnxruntime as ort
from onnxruntime.capi import _pybind_state as C


class Lent:
    """What numpy.from_dlpack asks for: an object with __dlpack__"""

    def __init__(self, cap):
        self.cap = cap

    def __dlpack__(self, stream=None, **kw):
        return self.cap

    def __dlpack_device__(self):
        return (1, 0)  # kDLCPU


limit = 2 if sys.argv[1] == "fail" else 3
queue = []


def to_numpy(cap):
    if len(queue) >= limit:
        raise RuntimeError("queue full")
    queue.append(np.from_dlpack(Lent(cap)))
    return queue[-1]


vals = C.OrtValueVector()
for n in (4, 5, 6):
    vals.push_back(ort.OrtValue.ortvalue_from_numpy(np.arange(n, dtype=np.float32))._ortvalue)
try:
    out = vals.to_dlpacks(to_numpy)  # <-- to-dlpacks
    print("sums", [float(a.sum()) for a in out], flush=True)
except RuntimeError as e:
    print("refused:", e, flush=True)
print("ok", flush=True)
