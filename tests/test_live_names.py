"""Names in the live reports (issue 36). The dlstatic fixture leaks a
DLPack tensor in a static function, sum_and_forget, which only the
module's .symtab holds (dladdr reads .dynsym and could not name it):

- `capsan run`: the runtime's report on stderr names it;
- `pytest --capsan`: the failing test's text names it, with its file:line
  (asked of `capsan symbolize`), under the test's id; the report file has
  it in the runtime's own finding (capsan.findings()'s frames);
- `capsan report` renders the plugin's --capsan-report file as text, JSON
  and HTML, as it renders a trace (it refused it before: bad magic).

On Debian's python3 (numpy 1.24) and a current venv (cp312, numpy 2)."""
import json
import re
import shutil
import subprocess
import textwrap

import pytest

from conftest import (CAPSAN, ROOT, STATIC_PY, base_env, check_schema, current_python,
                      fixdir_for, no_core, require, run_capsan)
from test_report_text import check_contract

PYDIR = ROOT / "build" / "python"
SOURCE = ROOT / "tests" / "fixtures" / "dlstatic.c"
STATIC_FN = "sum_and_forget"
NODEID = "test_sample.py::test_forgets_tensor"

TESTS = '''
import dlproducer as P
import dlstatic as S


def test_forgets_tensor():
    S.ramp_total(P.good(4))


def test_clean():
    pass
'''


@pytest.fixture(params=["static", "cp312"])
def py(request):
    p = STATIC_PY if request.param == "static" else current_python(request.param)
    so = fixdir_for(p) / "dlstatic.so"
    require(so, CAPSAN, PYDIR / "capsan" / "__init__.py")
    nm = shutil.which("nm")
    if nm:  # the point of the fixture: no exported symbol names the function
        out = subprocess.run([nm, "-D", "--defined-only", str(so)], capture_output=True,
                             text=True).stdout
        assert STATIC_FN not in out, out
    return p


def consume_line() -> int:
    """The line of sum_and_forget's PyCapsule_SetName call (the consume)."""
    hits = [i for i, line in enumerate(SOURCE.read_text().splitlines(), 1)
            if "PyCapsule_SetName(cap" in line]
    assert len(hits) == 1, hits
    return hits[0]


# `#0 0x7f.. in sum_and_forget ...`: a frame line naming the function
FRAME = re.compile(r"#\d+ 0x[0-9a-f]+ in " + STATIC_FN + r"\b(.*)")


def frame_lines(text):
    return [m.group(1) for m in FRAME.finditer(text)]


def run_pytest(tmp_path, py, args):
    d = tmp_path / "suite"
    d.mkdir()
    (d / "test_sample.py").write_text(textwrap.dedent(TESTS))
    e = base_env(None, py)
    e["PYTHONPATH"] = f"{PYDIR}:{fixdir_for(py)}"
    e["CAPSAN_OPTIONS"] = f"log_path={tmp_path / 't'}"
    for k in ("PYTEST_ADDOPTS", "PYTEST_PLUGINS", "PYTEST_DISABLE_PLUGIN_AUTOLOAD"):
        e.pop(k, None)
    cmd = [str(py), "-m", "pytest", "-p", "no:cacheprovider", "-rfE", *args, "test_sample.py"]
    cp = subprocess.run(cmd, capture_output=True, text=True, env=e, timeout=180, cwd=str(d),
                        stdin=subprocess.DEVNULL, preexec_fn=no_core)
    cp.describe = (f"command: {' '.join(cmd)}\nrc={cp.returncode}\n--- stdout\n{cp.stdout[-8000:]}"
                   f"\n--- stderr\n{cp.stderr[-3000:]}")
    return cp


def report(paths, *flags):
    """`capsan report FLAGS PATHS` (one path, or a list)."""
    paths = paths if isinstance(paths, list) else [paths]
    cmd = [str(CAPSAN), "report", *flags, *map(str, paths)]
    cp = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    cp.describe = f"command: {' '.join(cmd)}\nrc={cp.returncode}\n--- stderr\n{cp.stderr[-3000:]}"
    return cp


def test_capsan_run_live_report_names_the_static_function(tmp_path, py):
    res = run_capsan("import dlproducer as P, dlstatic as S\nS.ramp_total(P.good(4))\n",
                     tmp_path, interpreter=py)
    assert res.returncode == 23, res.describe()
    assert "ERROR: capsan: dlpack-leak" in res.stderr, res.describe()
    # the live text names it, with the module and offset the runtime has
    tails = frame_lines(res.stderr)
    assert tails and all(re.fullmatch(r" \(dlstatic\.so\+0x[0-9a-f]+\)", t) for t in tails), (
        f"{tails}\n{res.describe()}")
    # the offline report agrees, and adds the line
    (f,) = [f for p in res.report["processes"] for f in p["findings"]]
    consume = [ev for ev in f["events"] if ev["event"] == "consume"][0]
    top = consume["stack"][0]
    assert top["function"] == STATIC_FN and top["line"] == consume_line(), top


def test_findings_api_names_the_static_function(tmp_path, py):
    """capsan.findings(): the runtime's frames, as the runtime renders them."""
    script = tmp_path / "api.py"
    script.write_text(textwrap.dedent('''
        import capsan, dlproducer as P, dlstatic as S
        with capsan.trace() as t:
            S.ramp_total(P.good(4))
        for f in capsan.findings():
            for ev in f.events:
                for fr in ev.stack:
                    if not fr.python:
                        print(ev.event, fr.function, fr.module, str(fr))
    '''))
    e = base_env(None, py)
    e["PYTHONPATH"] = f"{PYDIR}:{fixdir_for(py)}"
    cp = subprocess.run([str(py), str(script)], capture_output=True, text=True, env=e,
                        timeout=120, stdin=subprocess.DEVNULL, preexec_fn=no_core)
    assert cp.returncode == 0, cp.stderr
    consumed = [line.split(" ", 3) for line in cp.stdout.splitlines() if line.startswith("consume ")]
    assert consumed, cp.stdout
    ev, fn, mod, text = consumed[0]
    assert (fn, mod) == (STATIC_FN, "dlstatic.so"), consumed[0]
    assert re.fullmatch(r"0x[0-9a-f]+ in %s \(dlstatic\.so\+0x[0-9a-f]+\)" % STATIC_FN, text), text


def test_pytest_plugin_names_the_static_function_and_the_test(tmp_path, py):
    out = tmp_path / "capsan.json"
    cp = run_pytest(tmp_path, py, ["--capsan", f"--capsan-report={out}"])
    assert cp.returncode == 1, cp.describe
    assert f"FAILED {NODEID} - capsan: dlpack-leak" in cp.stdout, cp.describe
    assert "1 failed, 1 passed" in cp.stdout, cp.describe
    failure = cp.stdout.split("capsan: 1 finding(s) in test_forgets_tensor")
    assert len(failure) == 2, cp.describe
    text = failure[1].split("SUMMARY: capsan:")[0]
    assert "ERROR: capsan: dlpack-leak" in text, text
    # named, with the file:line `capsan symbolize` found in the fixture's DWARF
    tails = frame_lines(text)
    assert tails, f"{STATIC_FN} not named in the failure text\n{cp.describe}"
    assert any(re.fullmatch(r" \S*dlstatic\.c:%d" % consume_line(), t) for t in tails), (
        f"{tails}\n{cp.describe}")
    assert f"{NODEID}: dlpack-leak x1" in cp.stdout, cp.describe
    # the report file holds the runtime's findings as capsan.findings() has
    # them: the function named by the runtime itself
    rep = json.loads(out.read_text())
    (t,) = [t for t in rep["tests"] if t["findings"]]
    assert t["nodeid"] == NODEID, t["nodeid"]
    (f,) = t["findings"]
    consume = [ev for ev in f["events"] if ev["event"] == "consume"][0]
    top = consume["stack"][0]
    assert top["function"] == STATIC_FN and top["module"] == "dlstatic.so", top
    assert top["module_path"] == str(fixdir_for(py) / "dlstatic.so") and top["build_id"], top


def test_capsan_report_renders_the_plugin_report(tmp_path, py):
    out = tmp_path / "capsan.json"
    cp = run_pytest(tmp_path, py, ["--capsan", f"--capsan-report={out}"])
    assert cp.returncode == 1 and out.exists(), cp.describe

    text = report(out)
    assert text.returncode == 0 and "bad magic" not in text.stderr, text.describe
    assert "pytest report: 2 traced test(s), 1 with findings; pytest exit status 1" in text.stdout, (
        text.stdout)
    assert f"-- test {NODEID}: 1 finding(s)\n" in text.stdout, text.stdout
    assert "ERROR: capsan: dlpack-leak: Direct leak of 16 byte(s) in 1 object(s)" in text.stdout, (
        text.stdout)
    # symbolized as a trace is: DWARF's file:line
    assert any(re.fullmatch(r" \S*dlstatic\.c:%d" % consume_line(), t)
               for t in frame_lines(text.stdout)), text.stdout
    assert re.search(r"in test_forgets_tensor\n", text.stdout), text.stdout
    assert "SUMMARY: capsan: 1 error(s), 0 warning(s) [dlpack-leak: 1]; 16 byte(s) leaked in 1 " \
           "object(s)." in text.stdout, text.stdout

    js = report(out, "--format", "json")
    assert js.returncode == 0, js.describe
    doc = json.loads(js.stdout)
    check_schema(doc)
    check_contract(doc)
    (p,) = doc["processes"]
    assert p["argv"][-1] == "test_sample.py" and p["status"] == 1, p
    assert p["summary"]["errors"] == 1 and p["summary"]["leaked_bytes"] == 16, p["summary"]
    (f,) = p["findings"]
    assert f["kind"] == "dlpack-leak" and f["test"] == NODEID and f["allowed"] is False, f
    # the message is the runtime's, word for word (the same model code)
    saved = json.loads(out.read_text())
    (sf,) = [f for t in saved["tests"] for f in t["findings"]]
    assert f["message"] == sf["message"], (f["message"], sf["message"])
    consume = [ev for ev in f["events"] if ev["event"] == "consume"][0]
    assert consume["stack"][0]["function"] == STATIC_FN, consume["stack"][0]
    assert consume["stack"][0]["line"] == consume_line(), consume["stack"][0]

    page = tmp_path / "report.html"
    html = report(out, "--format", "html", "-o", str(page))
    assert html.returncode == 0, html.describe
    body = page.read_text()
    assert body.count("<article class=\"finding") == 1, body[:2000]
    assert f"<h3 class=\"test\">test {NODEID}: 1 finding(s)</h3>" in body
    assert f"<span class=\"fn\">{STATIC_FN}</span>" in body
    assert "<dt>pytest report</dt>" in body


def test_capsan_report_says_what_a_json_file_is_not(tmp_path):
    """Other JSON is refused with a reason; the pytest report beside it renders."""
    require(CAPSAN)
    other = tmp_path / "other.json"
    other.write_text('{"tool": "something else", "tests": []}\n')
    broken = tmp_path / "broken.json"
    broken.write_text('{\n "tool": "capsan", "tests": [\n')
    empty = tmp_path / "empty.json"
    empty.write_text('{"tool": "capsan", "format": 1, "pid": 7, "tests": [{"nodeid": "t.py::a", '
                     '"allow": [], "findings": []}], "outside_tests": []}')
    cp = report([other, broken, empty])
    assert cp.returncode == 1, cp.describe
    assert f"{other}: JSON, but not a capsan pytest report" in cp.stderr, cp.describe
    assert f"{broken}: not a capsan trace, and not JSON either: unexpected end" in cp.stderr, (
        cp.describe)
    assert "== process 7 (argv unknown) pytest report: 1 traced test(s), 0 with findings ==" \
        in cp.stdout, cp.stdout
    assert "SUMMARY: capsan: 0 error(s), 0 warning(s); 0 byte(s) leaked" in cp.stdout, cp.stdout
