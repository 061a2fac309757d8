"""nanoarrow's c_array() of a bare arrow_array capsule (no schema): it
makes an empty schema capsule itself (CSchema.allocate(), release NULL)
and reads it back to fill it, in another of its own extension modules.
The capsule never leaves nanoarrow: nothing is handed over empty
(issue 37, path 9)."""
import nanoarrow as na
import pyarrow as pa

_, arr = pa.array([1, 2, 3]).__arrow_c_array__()
try:
    a = na.c_array(arr)  # <-- placeholder
    print("imported", a.length, flush=True)
except Exception as e:  # nanoarrow refuses an array without a schema in some releases
    print("refused", type(e).__name__, flush=True)
