"""numpy 2 made array_function_dispatch (the __array_function__ wrapper of
most numpy functions) a C type, numpy._ArrayFunctionDispatcher, without
garbage-collector support (no Py_TPFLAGS_HAVE_GC, no tp_traverse), though
it holds the dispatcher and the implementation. A reference cycle through
one is never collected. numpy's own test_overrides.py::test_dispatcher_error
builds one: a function's frame holds the exception its dispatcher raises
(frame -> the dispatched function -> the dispatcher closure -> the
exception -> its traceback -> the frame). Every frame live when it was
raised, and all their locals, then stay alive for good. numpy 1.24's
dispatcher was a Python function: the cycle is collected.

Here call()'s frame keeps an 8000-byte array in such a cycle: at exit it
was never freed (numpy-leak at the marked line) on numpy 2; clean on 1.24.
"""
import numpy as np

try:
    from numpy._core.overrides import array_function_dispatch
except ImportError:  # numpy 1.x
    from numpy.core.overrides import array_function_dispatch


def call():
    kept = np.arange(1000.0)  # <-- pinned
    error = TypeError("the dispatcher refuses")  # as test_dispatcher_error does

    def dispatcher():
        raise error

    @array_function_dispatch(dispatcher)
    def func():
        return 3

    try:
        func()
    except TypeError:
        pass
    return float(kept[-1])


print("got", call(), flush=True)
