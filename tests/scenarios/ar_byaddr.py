"""The arrowaddr fixture (a database driver in C) trading Arrow structs
with pyarrow by address, no capsule: its query results imported by
RecordBatchReader._import_from_c, its parameters exported into its buffers
by Array._export_to_c. One bug per case (argv[1]); "clean" runs every
correct exchange. Lines carry markers the tests look for."""
import sys

import pyarrow as pa

import arrowaddr as fx

case = sys.argv[1]


def query(batches=3, n=10, bug=""):
    """The driver's result set, read by pyarrow; returns the reader and the
    address the driver filled."""
    where = fx.alloc("stream")
    fx.execute(where, batches, n, bug)  # <-- execute
    reader = pa.RecordBatchReader._import_from_c(where)  # <-- import
    return reader, where


def bind(values, bug=""):
    arr = pa.array(values, type=pa.int64())
    a, s = fx.alloc("array"), fx.alloc("schema")
    arr._export_to_c(a, s)  # <-- export
    total = fx.bind(a, s, bug)  # <-- bind
    fx.free(a)
    fx.free(s)
    return total


if case == "clean":
    reader, where = query()
    assert fx.cursor_error() is None  # the stream is alive: a fair question
    assert reader.read_all().num_rows == 30
    del reader
    fx.free(where)
    assert bind([1, 2, 3]) == 6
    # a round trip through the driver's buffers, as pyarrow's own tests do
    s = fx.alloc("stream")
    pa.RecordBatchReader.from_batches(pa.schema([("x", pa.int64())]),
                                      [pa.record_batch([[1, 2]], names=["x"])])._export_to_c(s)
    assert pa.RecordBatchReader._import_from_c(s).read_all().num_rows == 2
    fx.free(s)
elif case == "leak":
    buf_a, buf_s = fx.alloc("array"), fx.alloc("schema")
    for i in range(3):
        pa.array([i, i + 1], type=pa.int64())._export_to_c(buf_a, buf_s)  # <-- export-loop
        fx.bind(buf_a, buf_s, "leak")  # <-- bind-leak
    print("bound", flush=True)
elif case == "double-release":
    bind([4, 5], "copy")  # <-- never reached past the second release
elif case == "not-cleared":
    reader, where = query(bug="not_cleared")
    reader.read_all()
    del reader  # <-- drop-not-cleared
    print("survived", flush=True)
elif case == "use-after-release":
    reader, where = query()
    reader.read_all()
    del reader  # <-- drop-used
    print(fx.cursor_error())  # <-- stale
elif case == "misuse":
    reader, where = query(bug="barrier")
    fx.prefetch()  # <-- prefetch
    reader.read_next_batch()  # <-- read
    fx.prefetch_join()
    del reader
elif case == "bad-struct":
    where = fx.alloc("stream")
    fx.execute(where, 3, 10, "failed")
    try:
        pa.RecordBatchReader._import_from_c(where)  # <-- import-empty
    except ValueError as e:
        print("refused:", e, flush=True)
elif case == "describe":
    import json

    import capsan
    reader, where = query()
    a, sch = fx.alloc("array"), fx.alloc("schema")
    pa.array([1, 2, 3], type=pa.int64())._export_to_c(a, sch)
    for addr in (where, a, sch):
        d = capsan.describe(addr)
        print(json.dumps(d.as_dict()), flush=True)
        print(d, file=sys.stderr)
    try:
        capsan.describe(id(reader))  # an address capsan follows nothing at
    except TypeError as e:
        print("unknown:", e, flush=True)
    fx.bind(a, sch)
    del reader
print("done", flush=True)
