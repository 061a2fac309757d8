"""cuda.core's StridedMemoryView takes a DLPack tensor's data field as its
start and ignores byte_offset (cuda-python #2592, cuda-core before 1.2.0);
its __dlpack__ then re-exports that memory from data with byte_offset 0.
The producer (dlproducer.offset) puts 0..7 at data + 16 and -1.0 in the
four float32 slots before, so numpy reading the re-export sums 2.0, not
28.0. Runs on CPU memory: no GPU or driver needed."""
import numpy as np
from cuda.core.utils import StridedMemoryView

import dlproducer as P

src = P.Exporter(8, "offset")
view = StridedMemoryView.from_dlpack(src, stream_ptr=-1)  # <-- consume
out = np.from_dlpack(view)  # <-- reexport
print("sum", float(out.sum()), flush=True)
