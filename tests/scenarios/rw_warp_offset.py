"""warp's from_dlpack builds its array from DLTensor.data alone and ignores
byte_offset (warp-lang 1.19.0, the newest release). The producer
(dlproducer.offset) puts 0..7 at data + 16 and -1.0 in the four float32
slots before, so the warp array reads -1,-1,-1,-1,0,1,2,3 and sums 2.0, not
28.0. Runs on CPU: no GPU or driver needed.

argv[1]:
  "warp":  wp.from_dlpack consumes the tensor (dlpack-byte-offset-ignored
           at its line)
  "numpy": numpy's from_dlpack consumes it (it honors byte_offset) and warp
           wraps numpy's array: sums 28.0, nothing to report
"""
import os
import sys

import numpy as np
import warp as wp

import dlproducer as P

wp.config.quiet = True
wp.config.kernel_cache_dir = os.environ.get("TMPDIR")  # no kernels are built: nothing written
wp.init()
src = P.Exporter(8, "offset")
if sys.argv[1] == "warp":
    a = wp.from_dlpack(src)  # <-- consume
else:
    a = wp.array(np.from_dlpack(src), dtype=wp.float32, copy=False)  # <-- consume-numpy
assert a.ptr == a.__array_interface__["data"][0]
print("sum", float(a.numpy().sum()), flush=True)
