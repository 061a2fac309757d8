"""pytest plugin (`-p xapi_tables`) for test_upstream_suites.py: at the end
of the session, writes the DLPack exchange tables of the loaded types named
in CAPSAN_XAPI_TYPES ("module:qualname,..."), as {name: address}, to the
JSON file CAPSAN_XAPI_OUT, so the test can say which type a
dlpack-bad-exchange-table finding's table belongs to. capsan's own
exchange.table_of reads each capsule without recording a consumer."""
import importlib
import json
import os


def pytest_sessionfinish(session):
    from capsan import exchange
    out = {}
    for spec in filter(None, os.environ.get("CAPSAN_XAPI_TYPES", "").split(",")):
        mod, _, name = spec.partition(":")
        tp = getattr(importlib.import_module(mod), name)
        addr = exchange.table_of(tp)
        out[spec] = hex(addr) if addr else None
    with open(os.environ["CAPSAN_XAPI_OUT"], "w") as f:
        json.dump(out, f)
