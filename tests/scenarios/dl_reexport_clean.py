"""A real consumer that re-exports what it consumed, honoring byte_offset:
torch 2.13's from_dlpack starts its tensor at data + byte_offset, and its
to_dlpack exports that start (byte_offset 0). The producer's tensor
(dlproducer.offset) has byte_offset 16: the reader of the re-export sums
0..7 = 28.0. Nothing to report. (numpy cannot re-export what it imported:
its from_dlpack arrays are read-only, which DLPack cannot signal.)"""
import torch
from torch.utils import dlpack

import dlconsumer as C
import dlproducer as P

t = torch.from_dlpack(P.Exporter(8, "offset"))
print("torch", C.consume_good(dlpack.to_dlpack(t)), flush=True)
