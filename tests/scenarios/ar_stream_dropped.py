"""A C reader takes a polars DataFrame's stream (__arrow_c_stream__: made in
Rust), moves it out of its capsule into a heap holder, reads one batch and
frees the holder without calling the stream's release (arrowfx
consume_stream "drop_holder"). The stream, and the NumPy buffer the frame
shares zero-copy, stay alive for good: one arrow-leak of the stream, with
the buffer as its indirect part.

argv[1]: "bug" (drop_holder) or "fixed" ("move": read it all, release it)."""
import sys

import numpy as np
import polars as pl

import arrowfx

mode = "drop_holder" if sys.argv[1] == "bug" else "move"
values = np.arange(100_000, dtype=np.int64)  # <-- buffer
df = pl.DataFrame({"v": values})
del values
total = arrowfx.consume_stream(df, mode)  # <-- consume
del df
print("done", total, flush=True)
