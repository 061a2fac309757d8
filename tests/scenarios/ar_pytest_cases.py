"""Tests that pytest --capsan runs (tests/test_arrow_findings.py): an Arrow
leak and a reconsume fail their tests; a clean exchange passes."""
import arrowfx as fx

class Frame:
    def __arrow_c_array__(self, requested_schema=None):
        return fx.export_array(10)

def test_leaky():
    fx.consume_array(Frame(), "leak")

def test_reconsume():
    caps = Frame().__arrow_c_array__()
    class H:
        def __arrow_c_array__(self, requested_schema=None):
            return caps
    fx.consume_array(H())
    fx.consume_array(H())

def test_clean():
    fx.consume_array(Frame())
