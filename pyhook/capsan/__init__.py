"""capsan: a sanitizer for DLPack capsules and NumPy data memory.

    import capsan                      # loads and starts the runtime (libcapsan.so)
    with capsan.trace() as t:          # NumPy allocations of this context are traced
        work()
    t.findings                         # [Finding(kind='numpy-leak', bytes=8000, at='x.py:5')]
    t.assert_clean()                   # AssertionError with a LeakSanitizer-style report

The runtime is the one that LD_PRELOAD / `capsan run` loaded, if any;
otherwise the libcapsan.so beside this package (or $CAPSAN_LIB). The package
only binds it (see _lib.py): it never re-implements what the runtime does.

pytest: `pytest --capsan` (the plugin is registered through the
capsan-0.1.dist-info entry point) or `pytest -p capsan.pytest_plugin`.
"""
from . import _lib, exchange
from .finding import Event, Finding, Frame
from .tracing import Trace, trace
# the protocol's tools (issue 5): DLPack structs, describe(), allocators
from . import allocators, dlpack
from .allocator import (HandlerInfo, allocator, get_handler, handler_info, handler_name,
                        handler_version, set_handler, using)
from .describe import Description, describe

__version__ = "0.1"
__all__ = ["start", "stop", "active", "preloaded", "handler", "get_handler", "set_handler",
           "trace", "Trace", "Finding", "Event", "Frame", "findings", "findings_count",
           "library_path", "__version__", "dlpack", "allocators", "allocator", "using",
           "handler_name", "handler_version", "handler_info", "HandlerInfo", "describe",
           "Description"]

#: the path of the libcapsan.so this process runs
library_path = _lib.path


def start() -> bool:
    """Start the runtime (idempotent): True when tracing. After stop() it
    stays stopped (False): what was released meanwhile was not seen, so
    nothing it judged then could be trusted."""
    return exchange.start()


def stop() -> None:
    """Stop recording for good and restore every patched slot; wrapped
    destructors, deleters and tracing handlers keep forwarding to the
    originals. The process's exit then has no leak check, and a
    capsan.trace() entered later raises RuntimeError."""
    _lib.stop()


def active() -> bool:
    """True while the runtime records."""
    return _lib.active()


def preloaded() -> bool:
    """True when the runtime was started by LD_PRELOAD / `capsan run` (it
    then owns the exit report and the exit status)."""
    return _lib.preloaded()


def handler(inner=None):
    """A new tracing PyDataMem_Handler capsule ("mem_handler", version 1)
    forwarding to `inner` (a mem_handler capsule; None: numpy's current
    handler). Install it yourself with numpy's PyDataMem_SetHandler, or
    with set_handler() -- or let trace() do both."""
    return _lib.handler_new(inner)


def findings_count() -> int:
    """How many findings the runtime reported so far in this process."""
    return _lib.findings_count()


def findings(since: int = 0) -> list:
    """The findings reported after the first `since` ones (all by default)."""
    from .finding import parse
    return parse(_lib.findings_json(since))


def _loaded_as_pytest_plugin() -> bool:
    """True while pytest's plugin loader imports us (the pytest11 entry
    point is looked at in every pytest run that can see capsan-0.1.dist-info):
    then the plugin starts the runtime only if a test asks for it."""
    import sys
    f = sys._getframe(1)
    while f is not None:
        co = f.f_code
        # pluggy's load_setuptools_entrypoints (the pytest11 entry point),
        # pytest's import_plugin (-p, pytest_plugins)
        if (co.co_name in ("load_setuptools_entrypoints", "import_plugin")
                and ("_pytest" in co.co_filename or "pluggy" in co.co_filename)):
            return True
        f = f.f_back
    return False


def _run_as_command() -> bool:
    """True while `python -m capsan` imports the package to run its
    __main__: the command runs in a process of its own (exec), so there is
    nothing to trace here. Only that: a program run with `python -m` that
    imports capsan still starts it."""
    import sys
    f = sys._getframe(1)
    while f is not None:
        co = f.f_code
        if (co.co_name == "_run_module_as_main" and co.co_filename.endswith("runpy.py")
                and f.f_locals.get("mod_name") == __name__):
            return True
        f = f.f_back
    return False


if not _loaded_as_pytest_plugin() and not _run_as_command():
    if _lib.load_error is not None:
        raise _lib.load_error
    start()
