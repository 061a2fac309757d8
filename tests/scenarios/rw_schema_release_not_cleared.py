"""kuzu 0.0.8 (kuzudb/kuzu #2037, fixed in 0.0.9 by PRs #2019 and #2055):
QueryResult.get_as_arrow hands pyarrow its ArrowSchema by address
(Schema._import_from_c, then RecordBatch._import_from_c for each chunk),
and the schema's release callback tests its guard the wrong way round
(returns when release is set), so it neither frees its holder nor sets
release = NULL. pyarrow 13 checks that after releasing and aborts
("ArrowSchemaRelease did not cleanup release callback")."""
import tempfile

import kuzu

db = kuzu.Database(tempfile.mkdtemp(prefix="capsan-kuzu-") + "/db")
conn = kuzu.Connection(db)
conn.execute("CREATE NODE TABLE Person(name STRING, age INT64, PRIMARY KEY(name))")
for name, age in (("Alice", 30), ("Bob", 41), ("Carol", 25)):
    conn.execute(f"CREATE (:Person {{name: '{name}', age: {age}}})")
result = conn.execute("MATCH (p:Person) RETURN p.name, p.age")
table = result.get_as_arrow(2)  # <-- to-arrow
print("rows", table.num_rows, table.column_names)
print("ok")
