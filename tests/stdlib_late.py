"""CPython's own tests of its extension modules, in one process, with capsan
started late: every module under test (and the C module behind it) is
imported first, then `import capsan` starts the runtime, as pytest's plugin
or a script's `import capsan` would. With --native capsan is never imported.

    python stdlib_late.py [--native] test_decimal test_array ...

Prints one JSON line: {"test_decimal": [run, failures, errors, skipped], ...}
(an abort or a crash prints nothing: the caller sees the status). The
verdict is the comparison with --native on the same interpreter.
"""
import importlib
import io
import json
import sys
import time
import unittest

# the C modules each test module exercises: imported before the start so
# that whatever they keep from the allocator (a function pointer in a
# variable, a table) was taken before capsan patched anything
C_MODULES = {
    "test_decimal": ["decimal", "_decimal"],
    "test_array": ["array"],
    "test_struct": ["struct", "_struct"],
    "test_json": ["json", "_json"],
    "test_zlib": ["zlib"],
    "test_ctypes": ["ctypes", "_ctypes"],
    "test_sqlite3": ["sqlite3", "_sqlite3"],
    "test_pickle": ["pickle", "_pickle"],
    "test_hashlib": ["hashlib", "_hashlib", "_sha256", "_md5"],
    "test_bz2": ["bz2", "_bz2"],
    "test_lzma": ["lzma", "_lzma"],
    "test_xml_etree_c": ["xml.etree.ElementTree", "_elementtree", "pyexpat"],
    "test_pyexpat": ["pyexpat"],
    "test_csv": ["csv", "_csv"],
    "test_datetime": ["datetime", "_datetime"],
    "test_io": ["io", "_io"],
}


def main(argv):
    native = "--native" in argv
    # no resource beyond the machine (urlfetch, network): unittest alone
    # would enable them all
    from test import support
    support.use_resources = []
    names = [a for a in argv if not a.startswith("--")]
    for n in names:
        for m in C_MODULES.get(n, []):
            try:
                importlib.import_module(m)
            except ImportError:
                pass  # a CPython built without it: its tests skip alike
    # the test modules themselves (and what they import) load before the start too
    suites = {}
    for n in names:
        suites[n] = unittest.defaultTestLoader.loadTestsFromName("test." + n)
    if not native:
        import capsan
        if not capsan.active():
            print("capsan did not start", file=sys.stderr)
            return 2
    out = {}
    for n, suite in suites.items():
        t0 = time.perf_counter()
        r = unittest.TextTestRunner(stream=io.StringIO(), verbosity=0).run(suite)
        if "--times" in argv:
            print(f"{n}: {time.perf_counter() - t0:.1f}s", file=sys.stderr)
        out[n] = [r.testsRun, len(r.failures), len(r.errors), len(r.skipped)]
        if r.failures or r.errors:
            for t, tb in (r.failures + r.errors)[:3]:
                print(f"{n}: {t}\n{tb}", file=sys.stderr)
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
