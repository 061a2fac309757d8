"""pytest plugin (`-p np_unskip`) for numpy 2's own test_mem_policy.py,
used by `make check-numpy`:

- numpy 2 marks test_new_policy `skip` ("too slow, see gh-23975"); it is
  run anyway, as numpy 1.24 does by default. Only that test's own skip mark
  is dropped.
- test_new_policy runs numpy's whole suite in a nested pytest session
  (np._core.test()). Every module that session imports (numpy's test
  modules, conftest, hypothesis) keeps its assertion rewriter as
  `__loader__`, and through it the nested session's Config, Session, every
  collected item and the arrays its collection made (parametrize values
  pytest keeps on the marks). CPython clears module dicts at exit after its
  last garbage collection, so that graph, cycles all through, is never
  freed: capsan would rightly call those arrays numpy-leak at exit
  (pytest's doing, not numpy's: about 117 blocks with numpy 2.4 and pytest
  9). When the outer session finishes, those modules' loaders are let go
  and a collection frees the nested session, as it would have been freed
  had CPython collected after clearing module dicts.
"""
import gc
import sys


def pytest_collection_modifyitems(items):
    for item in items:
        if getattr(item, "originalname", item.name) == "test_new_policy":
            item.own_markers = [m for m in item.own_markers if m.name != "skip"]


def pytest_sessionfinish(session):
    ours = session.config
    for mod in list(sys.modules.values()):
        spec = getattr(mod, "__spec__", None)
        for holder, attr in ((mod, "__loader__"), (spec, "loader")):
            loader = getattr(holder, attr, None) if holder is not None else None
            if (type(loader).__name__ == "AssertionRewritingHook"
                    and getattr(loader, "config", ours) is not ours):
                try:
                    setattr(holder, attr, None)
                except (AttributeError, TypeError):
                    pass
    gc.collect()
