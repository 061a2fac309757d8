"""Arrow findings in capsan.trace() scopes (API mode, `import capsan`): a
moved array never released is an arrow-leak when the scope ends; a clean
exchange in the next scope is clean; a killed process (argv[1] == "kill")
leaves arrow-leak warnings for what it still held."""
import json
import os
import signal
import sys

import capsan
import arrowfx as fx


class Frame:
    def __arrow_c_array__(self, requested_schema=None):
        return fx.export_array(10)  # <-- export


if sys.argv[1:] == ["kill"]:
    held = Frame().__arrow_c_array__()  # never consumed, alive when killed
    os.kill(os.getpid(), signal.SIGKILL)
with capsan.trace() as t:
    fx.consume_array(Frame(), "leak")  # <-- leak
print(json.dumps([f.kind for f in t.findings]))
with capsan.trace() as t2:
    fx.consume_array(Frame())
print(json.dumps([f.kind for f in t2.findings]))
