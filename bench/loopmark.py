"""Where a workload's loop starts and ends, for bench/icount.py: with
BENCH_CG_MARK naming build/bench/cgmark.so, loop_starts() turns
callgrind's instrumentation on and loop_ends() dumps the loop's count
(bench/cgmark.c); without it, both do nothing. The library is loaded at
import, before the loop, so loading it is start-up."""
import os

_start = _end = None
if os.environ.get("BENCH_CG_MARK"):
    import ctypes
    _lib = ctypes.CDLL(os.environ["BENCH_CG_MARK"])
    _start, _end = _lib.capsan_bench_loop_starts, _lib.capsan_bench_loop_ends
    for _f in (_start, _end):
        _f.restype, _f.argtypes = None, []


def loop_starts():
    if _start is not None:
        _start()


def loop_ends():
    if _end is not None:
        _end()
