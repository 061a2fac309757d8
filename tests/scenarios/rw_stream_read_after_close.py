"""apache/arrow #34906 (pyarrow 11.0.0, fixed in 12.0.0 by PR #35016): a
RecordBatchReader handed over by address through a C struct that cffi
allocates (pyarrow's own example of the C stream interface) releases the
ArrowArrayStream when it is closed, and its read_all() still calls the
stream's get_next: the exporter's private data is gone, and pyarrow 11
jumps through it (SIGSEGV). pyarrow 12 raises ArrowInvalid instead."""
import pyarrow as pa
from pyarrow.cffi import ffi

schema = pa.schema([("col", pa.int64())])
batches = [pa.record_batch([[1, 2, 3]], schema),
           pa.record_batch([[None, 5, 6]], schema)]
reader = pa.RecordBatchReader.from_batches(schema, batches)

c_stream = ffi.new("struct ArrowArrayStream*")
ptr = int(ffi.cast("uintptr_t", c_stream))
reader._export_to_c(ptr)  # <-- export
del reader, batches
imported = pa.RecordBatchReader._import_from_c(ptr)  # <-- import
imported.close()  # <-- close
try:
    table = imported.read_all()  # <-- read
    print("read", table.num_rows)
except pa.ArrowInvalid as e:
    print("refused:", e)
print("ok")
