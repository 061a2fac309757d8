"""Real libraries that trade Arrow structs with pyarrow by address (R49),
each used correctly: ADBC's driver manager with its SQLite driver (query
results imported by RecordBatchReader._import_from_c, a table ingested),
duckdb (result readers, scans of pyarrow tables and readers) and polars
(to and from pyarrow). argv[1]: "adbc" or "engines"."""
import sys

import pyarrow as pa

case = sys.argv[1]
tbl = pa.table({"x": pa.array(range(1000), type=pa.int64()),
                  "s": pa.array([f"r{i}" for i in range(1000)])})

if case == "adbc":
    import adbc_driver_sqlite.dbapi as dbapi
    with dbapi.connect() as conn:
        with conn.cursor() as cur:
            cur.adbc_ingest("t", tbl, mode="create")
            cur.execute("SELECT x, s FROM t WHERE x % 3 = 0")
            got = cur.fetch_arrow_table()
            assert got.num_rows == 334, got.num_rows
            cur.execute("SELECT sum(x) AS total FROM t")
            assert cur.fetchone()[0] == sum(range(1000))
            cur.execute("SELECT x FROM t")
            reader = cur.fetch_record_batch()
            assert sum(b.num_rows for b in reader) == 1000
            cur.execute("SELECT * FROM t LIMIT 5")
            assert len(cur.fetchall()) == 5
        conn.commit()
    print("adbc ok", flush=True)
elif case == "engines":
    import duckdb
    import polars as pl
    con = duckdb.connect()
    assert con.execute("SELECT count(*) FROM tbl").fetchone()[0] == 1000
    rdr = con.execute("SELECT x FROM range(5000) t(x)").to_arrow_reader(1000)
    assert sum(b.num_rows for b in rdr) == 5000
    assert con.execute("SELECT * FROM tbl WHERE x < 10").to_arrow_table().num_rows == 10
    src = pa.RecordBatchReader.from_batches(tbl.schema, tbl.to_batches(max_chunksize=100))
    assert con.execute("SELECT count(*) FROM src").fetchone()[0] == 1000
    df = pl.from_arrow(tbl)
    assert df.height == 1000
    assert df.to_arrow().num_rows == 1000
    assert pl.DataFrame(tbl).select(pl.col("x").sum()).item() == sum(range(1000))
    print("engines ok", flush=True)
print("done", flush=True)
