"""Correctly managed tensors that are still alive when the program ends: they
are released during interpreter finalization, which is not a leak."""
import numpy as np
import torch

import dlproducer as P

KEEP_TORCH_VIEW = torch.from_dlpack(np.arange(10, dtype=np.float32))  # numpy memory in torch
KEEP_NUMPY_VIEW = np.from_dlpack(torch.arange(10))  # torch memory in numpy
KEEP_FIXTURE_VIEW = np.from_dlpack(P.Exporter(5))  # fixture memory in numpy
KEEP_CAPSULE = P.good(4)  # an unconsumed capsule with a correct destructor
KEEP_VERSIONED = P.versioned(4)


class Holder:
    def __init__(self):
        self.me = self  # a reference cycle: freed by the final garbage collection
        self.t = torch.from_dlpack(np.ones(3))


h = Holder()
del h
print("exiting with live views", float(KEEP_TORCH_VIEW.sum()), int(KEEP_NUMPY_VIEW.sum()))
