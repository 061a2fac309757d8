"""The source tree's arrows run one way (issue 19: "preload/ has no circle
of files"): within preload/, model/ and reports/, a file X.c that includes
Y.h depends on Y.c, and no chain of such dependencies leads back to X.
A service every hook calls (runtime.c) must not also reach the code that
starts or ends the hooks; a circle is reported with its files."""
import re

import pytest

from conftest import ROOT

INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"/]+)\.h"', re.M)


def dependencies(folder):
    """{module: modules whose header it includes}, for modules with a .c
    (in folder and its sub-folders: preload/'s headers are included by
    name from any of them)"""
    files = {p.stem: p for p in folder.rglob("*.c")}
    return {m: {i for i in INCLUDE.findall(p.read_text()) if i in files and i != m}
            for m, p in files.items()}


def circles(graph):
    """Strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on, out = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_circles_are_found():
    """The check itself: a two-file and a three-file circle are caught,
    a chain is not."""
    assert circles({"a": {"b"}, "b": {"a"}, "c": set()}) == [["a", "b"]]
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == [["a", "b", "c"]]
    assert circles({"a": {"b"}, "b": {"c"}, "c": set()}) == []


@pytest.mark.parametrize("folder", ["preload", "model", "reports"])
def test_no_circle_of_files(folder):
    graph = dependencies(ROOT / folder)
    assert len(graph) > 3, graph
    assert circles(graph) == [], f"{folder}/: files that depend on each other in a circle"


def test_runtime_service_reaches_no_hook_module():
    """runtime.c, which every hook calls, reaches (through what it
    includes) neither start.c nor ending.c nor a hook module."""
    graph = dependencies(ROOT / "preload")
    seen, todo = set(), ["runtime"]
    while todo:
        m = todo.pop()
        for d in graph[m] - seen:
            seen.add(d)
            todo.append(d)
    assert not seen & {"start", "ending", "capsule", "numpy", "arrow", "xapi", "deleter"}, seen


# ---- calls and data, not only includes (issue 32) ----
# A file may call a function that another file defines while the header it
# includes declares it under another module's name: the include graph above
# misses that arrow. The linker's view does not: a module depends on every
# module that defines a symbol it leaves undefined. The objects are the
# sanitizer builds' (no -flto: their symbol tables are plain ELF), which
# `make test` builds before the tests run.
OBJ_DIRS = {
    "preload": [ROOT / "build" / "ubsan" / "obj" / "rt" / "preload",
                *sorted((ROOT / "build" / "ubsan" / "obj" / "rt" / "preload").glob("*/")),
                ROOT / "build" / "ubsan" / "obj" / "rt" / "model"],
    "model": [ROOT / "build" / "asan" / "obj" / "cli" / "model"],
    "reports": [ROOT / "build" / "asan" / "obj" / "cli" / "reports"],
}


def symbol_graph(dirs):
    """{object stem: stems of the objects defining what it uses}"""
    import subprocess
    defs, uses = {}, {}
    for d in dirs:
        for o in sorted(d.glob("*.o")):
            out = subprocess.run(["nm", str(o)], capture_output=True, text=True,
                                 check=True).stdout
            for line in out.splitlines():
                parts = line.split()
                if len(parts) == 3 and parts[1] in "TDBRC":
                    defs.setdefault(parts[2], o.stem)
                elif len(parts) == 2 and parts[0] == "U":
                    uses.setdefault(o.stem, set()).add(parts[1])
    mods = set(defs.values()) | set(uses)
    return {m: {defs[u] for u in uses.get(m, ()) if u in defs and defs[u] != m}
            for m in mods}


@pytest.mark.parametrize("part", ["preload", "model", "reports"])
def test_no_circle_of_calls(part):
    dirs = OBJ_DIRS[part]
    missing = [str(d) for d in dirs[-1:] + dirs[:1] if not list(d.glob("**/*.o"))]
    if missing:
        pytest.fail("no sanitizer-build objects in " + ", ".join(missing)
                    + " -- run `make sanitizers`", pytrace=False)
    graph = symbol_graph(dirs)
    assert len(graph) > 3, graph
    assert circles(graph) == [], f"{part}/: files that call each other in a circle"


PY_IMPORT = re.compile(r'^\s*from\s+\.(\w*)\s+import\s+([\w, ]+)', re.M)


def test_no_circle_of_python_modules():
    """pyhook/capsan: a module importing another (at the top or inside a
    function) depends on it; the package's __init__ is above them all."""
    pkg = ROOT / "pyhook" / "capsan"
    mods = {p.stem for p in pkg.glob("*.py")} - {"__init__", "__main__"}
    graph = {}
    for m in mods:
        deps = set()
        for frm, names in PY_IMPORT.findall((pkg / f"{m}.py").read_text()):
            if frm:
                deps.add(frm)
            else:
                deps |= {n.strip() for n in names.split(",")}
        graph[m] = {d for d in deps if d in mods and d != m}
    assert len(graph) > 3, graph
    assert circles(graph) == [], "pyhook/capsan: modules that import each other in a circle"


def test_preload_by_seam_and_service():
    """preload/: start.c (which starts every seam) and the public header at
    the top, everything else in a folder named for its service or seam, so
    that the folder names alone say where a concern lives."""
    pre = ROOT / "preload"
    top = sorted(p.name for p in pre.iterdir() if p.is_file())
    assert top == ["capsan.h", "exports.map", "start.c"], top
    folders = sorted(p.name for p in pre.iterdir() if p.is_dir())
    assert folders == ["arrow", "core", "dlpack", "ending", "exchange", "numpy", "stacks"], folders
    for f in folders:
        assert list((pre / f).glob("*.c")), f"preload/{f}/ has no source"


def test_files_fit_in_a_head():
    """No source file of the runtime, the model or the report tool much over
    700 lines (issue 32): a file that grew past it has two concerns."""
    big = {str(p.relative_to(ROOT)): n for part in ("preload", "model", "reports")
           for p in (ROOT / part).rglob("*.c")
           if (n := len(p.read_text().splitlines())) > 750}
    assert not big, f"split along their concerns: {big}"
