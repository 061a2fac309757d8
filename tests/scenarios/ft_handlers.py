"""NumPy's current memory handler (NEP 49) is a ContextVar: on 3.13t a new
thread starts with an empty context (numpy's default handler); 3.14+'s
free-threaded builds start it in a copy of its starter's context
(sys.flags.thread_inherit_context), which copy_context().run shows here.
capsan's tracing handler, capsan.using() and capsan.trace() must be right
either way, and a block made by one handler and freed on another thread
judged by the handler that made it.

    python ft_handlers.py MODE

fresh:   in a trace() scope, a thread that does not inherit leaks a block:
         numpy's default handler made it, so the scope has no leak (the
         process's end has, at the thread's line)
inherit: the same thread in a copy of the scope's context: the scope's
         tracing handler made the block, the scope reports the leak at the
         thread's line
cross:   blocks made through capsan.allocator() in one thread and through
         the scope's tracing handler in an inheriting thread, freed on
         other threads after those scopes ended: nothing to report
Prints a JSON line, then "done"."""
import contextvars
import json
import sys
import threading

import numpy as np

import capsan
import np_leaky

mode = sys.argv[1]
out = {"gil": sys._is_gil_enabled() if hasattr(sys, "_is_gil_enabled") else True,
       "inherit_flag": getattr(sys.flags, "thread_inherit_context", None)}


def run_thread(fn, inherit):
    th = threading.Thread(target=contextvars.copy_context().run if inherit else fn,
                          args=(fn,) if inherit else ())
    th.start()
    th.join()


def leaky():
    out["thread_handler"] = capsan.handler_name()
    a = np.ones(1000)  # <-- thread-leak
    np_leaky.keep_forever(a)


if mode in ("fresh", "inherit"):
    with capsan.trace(check=False) as t:
        out["scope_handler"] = capsan.handler_name()
        run_thread(leaky, mode == "inherit")
    out["scope"] = [[f.kind, f.at] for f in t.findings]
elif mode == "cross":
    kept = []
    mine = capsan.allocator("mine")

    def make_mine():
        with capsan.using(mine):
            kept.append(np.ones(1000))  # <-- mine-alloc
        out["thread_handler"] = capsan.handler_name()

    run_thread(make_mine, False)
    out["mine_block"] = capsan.handler_name(kept[0])

    with capsan.trace(check=False, roots=True) as t:
        out["scope_handler"] = capsan.handler_name()
        run_thread(lambda: kept.append(np.ones(2000)), True)
    out["traced_block"] = capsan.handler_name(kept[1])
    out["scope"] = [[f.kind, f.at] for f in t.findings]
    run_thread(kept.clear, False)  # both freed on a third thread, on the default handler
    out["after"] = capsan.handler_name()
print(json.dumps(out))
print("done")
