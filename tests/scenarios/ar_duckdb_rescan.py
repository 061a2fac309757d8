"""duckdb scans an object whose __arrow_c_stream__ hands out the same
capsule every time, as duckdb's own tests do on purpose: the first query
moves the stream out; the second reads a released stream, which duckdb
checks (release != NULL) and refuses with its "already consumed" error.
arrow-reconsume at the second scan, whose advice is about the second
hand-over, not a consumer that failed to check."""
import duckdb
import pyarrow as pa

cap = pa.table({"a": [1, 2, 3]}).__arrow_c_stream__()  # <-- export


class Holder:
    def __arrow_c_stream__(self, requested_schema=None):
        return cap  # the same capsule every time


h = Holder()
con = duckdb.connect()
print(con.sql("select sum(a) from h").fetchall(), flush=True)
try:
    con.sql("select sum(a) from h").fetchall()  # <-- again
except duckdb.Error as e:
    print("raised:", type(e).__name__, flush=True)
