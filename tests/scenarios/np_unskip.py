"""pytest plugin (`-p np_unskip`) for numpy 2's own test_mem_policy.py,
used by `make check-numpy`:

- numpy 2 marks test_new_policy `skip` ("too slow, see gh-23975"); it is
  run anyway, as numpy 1.24 does by default. Only that test's own skip mark
  is dropped.
- hypothesis is imported here, by the outer pytest session, as its pytest
  plugin would be on a usual install. numpy's conftest imports it; left to
  the nested session test_new_policy starts (np._core.test()), its modules
  get that session's assertion rewriter as their loader, which keeps the
  nested session's Config, and every array its collection made, alive
  through interpreter finalization: memory CPython never frees at exit,
  which capsan would rightly report as numpy-leak, but pytest's doing.
"""
import hypothesis  # noqa: F401


def pytest_collection_modifyitems(items):
    for item in items:
        if getattr(item, "originalname", item.name) == "test_new_policy":
            item.own_markers = [m for m in item.own_markers if m.name != "skip"]
