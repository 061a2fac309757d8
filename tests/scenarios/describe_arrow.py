"""capsan.describe() of Arrow capsules and objects (argv[1]: 'json' prints
the descriptions as JSON lines)."""
import json
import sys

import capsan
import arrowfx as fx


class Frame:
    def __arrow_c_array__(self, requested_schema=None):
        return fx.export_array(5)

    def __arrow_c_stream__(self, requested_schema=None):
        return fx.export_stream(2, 5)


class Empty:
    def __arrow_c_array__(self, requested_schema=None):
        return fx.export_array(5, "empty")


for obj in (Frame(), fx.export_stream(1, 3), Empty()):
    d = capsan.describe(obj)
    print(json.dumps(d.as_dict()))
    print(d, file=sys.stderr)
# describing is no consumption: the capsules were released by their destructors
