"""Many processes: `capsan run` follows multiprocessing children (start methods
fork and spawn: spawn children are exec'ed interpreters) and subprocess
children; every process writes its own trace, and `capsan report` merges them
into one report with the parent/child relation, a child's bug in that child's
section, and children that died of a signal reported as such from their
truncated traces. The processes really exchange numpy <-> torch tensors over
DLPack; one child commits a double delete (survived with protect=1).

Both scenarios start together (module fixture) to keep the suite quick."""
import json
import re
import subprocess
from pathlib import Path

import pytest

from conftest import (CAPSAN, STATIC_PY, TIMEOUT, base_env, events_at, findings, innermost_python,
                      marker_line, no_core, require_runtime, trace_files)
from test_report_html import check_page
from test_report_text import check_contract

SCRIPT = '''\
import multiprocessing as mp
import os
import signal
import subprocess
import sys

import numpy as np
import torch


def exchange(n):
    for i in range(n):
        a = np.arange(16, dtype=np.float32) + i
        t = torch.from_dlpack(a)
        b = np.from_dlpack(t.clone())
        assert float(b[0]) == float(i)


GRANDCHILD = """
import numpy as np
import dlconsumer as C, dlproducer as P
a = np.from_dlpack(P.Exporter(6))
assert a.tolist() == [0, 1, 2, 3, 4, 5]
C.consume_leak(P.good(4))
"""


def worker(n):
    exchange(n)
    # a subprocess of a child: an exec'ed grandchild that leaks a tensor
    if sys.argv[1] == "fork":
        subprocess.run([sys.executable, "-c", GRANDCHILD], check=False)


def buggy():
    import dlconsumer as C
    import dlproducer as P
    exchange(20)
    C.double_delete(P.good(8))  # <-- child-bug


def crash():
    exchange(5)
    os.abort()


def killed():
    exchange(5)
    os.kill(os.getpid(), signal.SIGKILL)


if __name__ == "__main__":
    method = sys.argv[1]
    ctx = mp.get_context(method)
    exchange(30)
    jobs = [(worker, (50,)), (buggy, ())]
    if method == "fork":
        jobs += [(crash, ()), (killed, ())]
    ps = [ctx.Process(target=f, args=a) for f, a in jobs]
    for p in ps:
        p.start()
        p.join()
    print("children", [[p.pid, p.exitcode] for p in ps], flush=True)
'''


class Run:
    def __init__(self, method, tmp):
        self.method, self.tmp = method, tmp
        self.script = tmp / "mp_prog.py"
        self.script.write_text(SCRIPT)
        env = base_env({"CAPSAN_OPTIONS": "protect=1"})
        self.cmd = [str(CAPSAN), "run", "--keep-trace", "--log-path", str(tmp / "t"), "--",
                    str(STATIC_PY),
                    str(self.script), method]
        self.proc = subprocess.Popen(self.cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                     env=env, cwd=tmp, preexec_fn=no_core, stdin=subprocess.DEVNULL)

    def finish(self):
        self.stdout, self.stderr = self.proc.communicate(timeout=TIMEOUT)
        self.rc = self.proc.returncode
        m = re.search(r"children (\[.*\])", self.stdout)
        assert m, f"{self.method}: the program did not finish ({self.rc}):\n{self.stderr[-4000:]}"
        self.children = {pid: code for pid, code in json.loads(m.group(1))}
        self.child_pids = [pid for pid, _ in json.loads(m.group(1))]
        self.traces = trace_files(self.tmp)
        r = subprocess.run([str(CAPSAN), "report", "--format", "json", *map(str, self.traces)],
                           capture_output=True, text=True, timeout=TIMEOUT)
        assert r.returncode == 0, r.stderr
        self.report = json.loads(r.stdout)
        check_contract(self.report)
        self.procs = {p["pid"]: p for p in self.report["processes"]}
        self.parent = self.proc_with_argv(str(self.script))
        return self

    def proc_with_argv(self, arg):
        ps = [p for p in self.report["processes"] if p["ppid"] != 0 and arg in p["argv"]
              and p["pid"] not in self.children]
        assert len(ps) == 1, [p["argv"] for p in self.report["processes"]]
        return ps[0]

    def describe(self):
        return "\n".join(f"{p['pid']} ppid={p['ppid']} {p['ended']}/{p['status']} "
                         f"{[f['kind'] for f in p['findings']]} {p['argv'][:3]}"
                         for p in self.report["processes"]) + "\n" + self.stderr[-3000:]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    require_runtime()
    started = {m: Run(m, tmp_path_factory.mktemp(m)) for m in ("fork", "spawn")}
    return {m: r.finish() for m, r in started.items()}


def test_fork_children(runs):
    r = runs["fork"]
    worker, bug, crash, killed = r.child_pids
    assert r.children[bug] == 23, r.children        # the buggy child's status: exitcode
    assert r.children[crash] == -6 and r.children[killed] == -9, r.children
    # one trace per process: the parent, four children, and the worker's subprocess
    assert len(r.traces) == 6, r.describe()
    parent = r.parent
    assert parent["ended"] == "exit" and parent["findings"] == [], r.describe()
    for pid in r.child_pids:
        assert r.procs[pid]["ppid"] == parent["pid"] and r.procs[pid]["parent"] == parent["pid"]
    # the bug is in the buggy child's section, at the marked line of the child's code
    assert [f["kind"] for f in r.procs[bug]["findings"]] == ["dlpack-double-delete"], r.describe()
    f = r.procs[bug]["findings"][0]
    line = marker_line(r.script, "child-bug")
    assert any(innermost_python(ev) == (r.script.name, line)
               for ev in events_at(f, r.script, line, "delete")), f
    assert all(r.procs[p]["findings"] == [] for p in (worker, crash, killed)), r.describe()
    # deaths by signal, from truncated traces
    assert r.procs[crash]["ended"] == "signal" and r.procs[crash]["status"] == 6
    assert r.procs[killed]["ended"] == "unknown"
    # the grandchild: exec'ed by subprocess from the worker; it leaked a tensor
    grand = [p for p in r.report["processes"] if p["ppid"] == worker]
    assert len(grand) == 1, r.describe()
    assert grand[0]["argv"][:2] == [str(STATIC_PY), "-c"] and grand[0]["parent"] == worker
    assert [f["kind"] for f in grand[0]["findings"]] == ["dlpack-leak"], r.describe()
    # real exchanges happened in every process (COUNTS: events observed)
    for p in r.report["processes"]:
        assert p["summary"]["events"] > 0 and p["counts"]["records"] > 0, p["pid"]


def test_spawn_children(runs):
    r = runs["spawn"]
    worker, bug = r.child_pids
    assert r.children == {worker: 0, bug: 23}, r.children
    assert len(r.traces) == 3, r.describe()
    parent = r.parent
    for pid in (worker, bug):
        p = r.procs[pid]
        # exec'ed interpreters: their own argv, the parent's pid
        assert p["ppid"] == parent["pid"] and p["parent"] == parent["pid"]
        assert any("multiprocessing.spawn" in a for a in p["argv"]), p["argv"]
        assert p["ended"] == "exit" and p["summary"]["events"] > 0
    assert r.procs[worker]["findings"] == []
    fs = r.procs[bug]["findings"]
    assert [f["kind"] for f in fs] == ["dlpack-double-delete"], r.describe()
    line = marker_line(r.script, "child-bug")
    assert events_at(fs[0], r.script, line, "delete"), fs[0]
    assert findings(r.report, "dlpack-double-delete") == fs


def test_merged_text_report(runs):
    r = runs["fork"]
    worker, bug, crash, killed = r.child_pids
    out = subprocess.run([str(CAPSAN), "report", *map(str, reversed(r.traces))], capture_output=True,
                         text=True, timeout=TIMEOUT).stdout
    parent = r.parent["pid"]
    # one section per process, the parent first, children in start order
    heads = re.findall(r"^== process (\d+) .*==$", out, re.M)
    assert [int(h) for h in heads][:2] == [parent, worker] and len(heads) == 6, heads
    assert f"== process {bug} (" in out and f"child of {parent}, ended: _exit 0 (leaks judged by reachability) ==" in out
    sect = out[out.index(f"== process {bug} ("):]
    sect = sect[:sect.index("SUMMARY")]
    assert f"=={bug}==ERROR: capsan: dlpack-double-delete" in sect
    assert "deleter call skipped (protect=1) at" in sect
    assert f"child of {parent}, ended: signal 6 (SIGABRT) ==" in out
    assert re.search(rf"== process {killed} .* ended: unknown \(no END record: killed", out)
    # the tree: four children under the parent, the subprocess under the worker
    tree = out[out.index("== process tree (6 processes) =="):].splitlines()[1:7]
    assert tree[0].startswith(f"{parent} ")
    assert tree[1].startswith(f"|-- {worker} ") and tree[2].startswith("|   `-- "), tree
    assert "1 error(s)" in tree[2] and "byte(s) leaked" in tree[2]
    assert tree[3].startswith(f"|-- {bug} ") and "1 error(s)" in tree[3]
    assert tree[4].startswith(f"|-- {crash} ") and "signal 6 (SIGABRT)" in tree[4]
    assert tree[5].startswith(f"`-- {killed} ") and "unknown" in tree[5]


def test_merged_html_report(runs, tmp_path):
    r = runs["fork"]
    html = tmp_path / "mp.html"
    cp = subprocess.run([str(CAPSAN), "report", "--format", "html", "-o", str(html), *map(str, r.traces)],
                        capture_output=True, text=True, timeout=TIMEOUT)
    assert cp.returncode == 0, cp.stderr
    nfind = sum(len(p["findings"]) for p in r.report["processes"])
    npoints = sum(len(p["counts"]["points"]) for p in r.report["processes"])
    dom = check_page(tmp_path, html, cards=nfind, points=npoints, shot=False)
    assert dom.count('<section class="process"') == 6
    assert dom.count("killed by signal 6 (SIGABRT)") == 2     # the table and the section
