"""Shared by the np_* scenarios: print a trace's findings as one JSON line
(`CAPSAN-FINDINGS [...]`) for the test to parse, and the trace's own
repr/report bits the tests check."""
import json


def multiarray():
    """numpy's multiarray module: numpy._core.multiarray in numpy 2 (where
    numpy.core warns on every attribute), numpy.core.multiarray in 1.x."""
    try:
        from numpy._core import multiarray as m
    except ImportError:
        from numpy.core import multiarray as m
    return m


def emit(t):
    fs = t.findings
    print("CAPSAN-REPR " + json.dumps([repr(f) for f in fs]), flush=True)
    print("CAPSAN-FINDINGS " + json.dumps([f.raw for f in fs]), flush=True)


def run_mode(fns, mode, traced):
    """Run fns[mode], inside capsan.trace() when `traced` (then print its
    findings with emit), and say the program survived it."""
    fn = fns[mode]
    if traced:
        import capsan
        with capsan.trace() as t:
            fn()
        emit(t)
    else:
        fn()
    print("survived", mode, flush=True)
