"""`capsan report` text and JSON: golden text (synthetic traces exactly; a real
run with pids, addresses, times and interpreter frames normalised), leaks
grouped by allocation stack (largest first), max_findings, colour only on a
terminal, --gen-suppressions round trips, suppression matching, and the JSON
report checked against the contract's schema (tests/golden/report_schema.json).

Set CAPSAN_UPDATE_GOLDEN=1 to rewrite the golden files after an intended
change of the output."""
import json
import os
import pty
import re
import subprocess
from pathlib import Path

import pytest

from conftest import CAPSAN as CAPSAN_RUN, STATIC_PY, base_env, contract_kinds, no_core, require_runtime
from test_reader_robust import (CAPSAN, REC_OPTIONS, cstr, rec, report, write)
from test_report_html import child_trace, parent_trace

pytestmark = pytest.mark.skipif(not os.path.exists(CAPSAN), reason="build/bin/capsan not built")

GOLDEN = Path(__file__).resolve().parent / "golden"
UPDATE = os.environ.get("CAPSAN_UPDATE_GOLDEN") == "1"


def golden(name, text):
    path = GOLDEN / name
    if UPDATE:
        path.write_text(text)
    assert path.exists(), f"{path} missing: run with CAPSAN_UPDATE_GOLDEN=1 to create it"
    want = path.read_text()
    if text != want:
        import difflib
        diff = "".join(difflib.unified_diff(want.splitlines(True), text.splitlines(True),
                                            f"golden/{name}", "actual"))
        pytest.fail(f"output differs from golden/{name} (CAPSAN_UPDATE_GOLDEN=1 rewrites it):\n{diff}")


# --- a minimal JSON Schema checker (the subset report_schema.json uses) ---------

def validate(doc, schema, path="$", root=None):
    root = root or schema
    if "$ref" in schema:
        schema = root["definitions"][schema["$ref"].split("/")[-1]]
    types = schema.get("type")
    if types:
        types = types if isinstance(types, list) else [types]
        pytypes = {"object": dict, "array": list, "string": str, "boolean": bool, "null": type(None)}
        ok = False
        for t in types:
            if t == "integer":
                ok |= isinstance(doc, int) and not isinstance(doc, bool)
            elif t == "number":
                ok |= isinstance(doc, (int, float)) and not isinstance(doc, bool)
            else:
                ok |= isinstance(doc, pytypes[t])
        assert ok, f"{path}: {doc!r} is not {types}"
    if "enum" in schema:
        assert doc in schema["enum"], f"{path}: {doc!r} not in {schema['enum']}"
    if "minimum" in schema:
        assert doc >= schema["minimum"], f"{path}: {doc} < {schema['minimum']}"
    if "pattern" in schema:
        assert re.search(schema["pattern"], doc), f"{path}: {doc!r} !~ {schema['pattern']}"
    if isinstance(doc, dict):
        for k in schema.get("required", []):
            assert k in doc, f"{path}: missing {k!r} (has {sorted(doc)})"
        for k, sub in schema.get("properties", {}).items():
            if k in doc:
                validate(doc[k], sub, f"{path}.{k}", root)
    if isinstance(doc, list) and "items" in schema:
        for i, x in enumerate(doc):
            validate(x, schema["items"], f"{path}[{i}]", root)
    if "oneOf" in schema:
        errs = []
        for sub in schema["oneOf"]:
            try:
                validate(doc, sub, path, root)
            except AssertionError as e:
                errs.append(str(e))
        assert len(errs) == len(schema["oneOf"]) - 1, f"{path}: oneOf: {errs}"


def check_contract(doc):
    schema = json.loads((GOLDEN / "report_schema.json").read_text())
    kind = schema["definitions"]["finding"]["properties"]["kind"]
    names = [n for n, _ in contract_kinds()]
    # DESIGN.md's kinds may never be renamed; kinds.inc may add more
    assert set(kind["enum"]) <= set(names), set(kind["enum"]) - set(names)
    kind["enum"] = names
    validate(doc, schema)


# --- synthetic traces --------------------------------------------------------------

@pytest.fixture
def synth(tmp_path):
    a = write(tmp_path, parent_trace(), "capsan.trace.4242")
    b = write(tmp_path, child_trace(ncounts=20), "capsan.trace.4243")
    return a, b


def test_text_golden_synthetic(synth):
    r = report(synth[1], synth[0])
    assert r.returncode == 0, r.stderr
    golden("report_synthetic.txt", r.stdout)


def test_leaks_grouped_largest_first(synth):
    out = report(synth[0]).stdout
    blocks = out.split("=" * 65 + "\n")[1:]
    heads = [b.splitlines()[0] for b in blocks]
    assert heads == [
        "==4242==ERROR: capsan: dlpack-double-delete: deleter of DLManagedTensor 0x55aa00001000 called twice",
        "==4242==ERROR: capsan: dlpack-leak: Direct leak of 8192 byte(s) in 2 object(s) exported from:",
        "==4242==ERROR: capsan: numpy-leak: Direct leak of 123 byte(s) in 1 object(s) allocated from:",
    ], heads
    # the example of a group is its oldest member, with its other events
    assert "  the first of them: DLManagedTensor 0x66000000 (4096 bytes) was consumed" in blocks[1]
    assert "  consumed at (thread T1):" in blocks[1]
    assert "SUMMARY: capsan: 4 error(s), 0 warning(s) [dlpack-double-delete: 1, dlpack-leak: 2, " \
           "numpy-leak: 1]; 8315 byte(s) leaked in 3 object(s)." in out


def test_max_findings(tmp_path, synth):
    out = report("--max-findings", "2", synth[0]).stdout
    assert out.count("ERROR: capsan:") == 2 and "numpy-leak" not in out.split("SUMMARY")[0]
    assert "Omitting 1 more finding(s). (max_findings=2)" in out
    assert "4 error(s)" in out                    # the summary counts everything
    out = report("--max-findings=1", synth[0]).stdout
    assert out.count("ERROR: capsan:") == 1 and "Omitting 3 more finding(s)." in out
    assert "Omitting" not in report("--max-findings", "0", synth[0]).stdout
    # the traced run's max_findings applies when the flag is not given
    data = parent_trace().replace(rec(REC_OPTIONS, cstr("log_path=capsan.trace")),
                                  rec(REC_OPTIONS, cstr("log_path=capsan.trace:max_findings=1")))
    p = write(tmp_path, data, "opt")
    assert "Omitting 3 more finding(s). (max_findings=1)" in report(p).stdout
    assert "Omitting" not in report("--max-findings", "10", p).stdout
    # JSON always holds every finding
    doc = json.loads(report("--format", "json", "--max-findings", "1", synth[0]).stdout)
    assert len(doc["processes"][0]["findings"]) == 4
    for bad in ("-1", "x", ""):
        r = report("--max-findings", bad, synth[0])
        assert r.returncode == 2 and "--max-findings" in r.stderr


def test_process_tree_text(synth):
    out = report(synth[1], synth[0]).stdout
    assert out.index("== process 4242 (") < out.index("== process 4243 (")
    assert "== process 4243 (python3 -c work()) child of 4242, ended: unknown (no END record" in out
    tree = out[out.index("== process tree (2 processes) =="):]
    lines = tree.splitlines()[1:3]
    assert lines[0].startswith("4242 python3 <script>") and ": exit 0; 4 error(s)" in lines[0]
    assert lines[1] == "`-- 4243 python3 -c work(): unknown (no END record: killed, or still running); " \
                       "1 error(s), 0 warning(s)", lines


def test_colour_only_on_a_terminal(synth):
    def on_pty(env):
        master, slave = pty.openpty()
        p = subprocess.Popen([CAPSAN, "report", synth[0]], stdout=slave, stderr=subprocess.PIPE, env=env)
        os.close(slave)
        data = b""
        while True:
            try:
                chunk = os.read(master, 65536)
            except OSError:
                break
            if not chunk:
                break
            data += chunk
        p.wait(timeout=30)
        os.close(master)
        return data.decode(errors="replace")
    env = {k: v for k, v in os.environ.items() if k != "NO_COLOR"}
    coloured = on_pty(env)
    assert "\033[1m\033[31mERROR: capsan: dlpack-double-delete" in coloured
    assert "\033[" not in on_pty(dict(env, NO_COLOR="1"))
    assert "\033[" not in report(synth[0]).stdout


def test_json_contract(synth):
    r = report("--format", "json", synth[0], synth[1])
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    check_contract(doc)
    kinds = [f["kind"] for p in doc["processes"] for f in p["findings"]]
    assert sorted(kinds) == ["dlpack-double-delete", "dlpack-double-delete", "dlpack-leak", "dlpack-leak",
                             "numpy-leak"]
    p = doc["processes"][0]
    assert p["summary"]["events"] == 123456       # END's count: every event, not only the kept ones
    assert p["summary"]["leaked_bytes"] == 8315
    assert doc["processes"][1]["ended"] == "unknown" and doc["processes"][1]["parent"] == 4242


# --- suppressions ----------------------------------------------------------------------

def test_gen_suppressions_round_trip(tmp_path, synth):
    r = report("--gen-suppressions", synth[0], synth[1])
    assert r.returncode == 0, r.stderr
    lines = [l for l in r.stdout.splitlines() if l and not l.startswith("#")]
    # the innermost frame of the program's own in the event that matters (a
    # leak's first event, the last event of anything else): a function whole
    # and anchored, else its file or module by the last component; exit-time
    # leaks in the order their objects were made (exports, then the alloc)
    assert lines == ["dlpack-double-delete:/<lib>&.so$",   # an unnamed native frame: its module
                     "dlpack-leak:/b>&amp;.py$",      # /work/<b>bold</b>&amp;.py, at <module>
                     "numpy-leak:/b>&amp;.py$",
                     "dlpack-double-delete:^work$"], r.stdout     # child.py's work()
    assert "# 5 finding(s), 4 distinct line(s)" in r.stdout
    supp = tmp_path / "gen.supp"
    supp.write_text(r.stdout)
    doc = json.loads(report("--format", "json", "--suppressions", str(supp), synth[0], synth[1]).stdout)
    assert [p["findings"] for p in doc["processes"]] == [[], []]
    assert [p["summary"]["suppressed"] for p in doc["processes"]] == [4, 1]
    text = report("--suppressions", str(supp), synth[0], synth[1]).stdout
    assert "Suppressions used:" in text and "  count      bytes template" in text
    assert re.search(r"\n\s+2\s+8192 dlpack-leak:/b>&amp;\.py\$\n", text), text


@pytest.mark.parametrize("rule,suppressed", [
    ("leak:*", 3),                          # leak: covers every *-leak kind
    ("dlpack-leak:bold", 2),                # no anchors: anywhere in the name
    ("*:x.py", 3),                          # any kind, any event: the leaks were consumed there
    ("*:^/work/x.py$", 3),
    ("*:^x.py", 0),                         # anchored at the start: no match
    ("dlpack-double-delete:consume*free", 1),   # '*' inside, matching a function
    ("numpy-leak:nonexistent", 0),          # a module name, but the leak's stack has none
    ("dlpack-double-delete:<lib>&.so", 1),  # a module path
    ("dlpack-double-delete:^/nonexistent/*.so$", 1),
    ("numpy-leak:x.py", 0),                 # not in the numpy leak's stack
])
def test_suppression_matching(tmp_path, synth, rule, suppressed):
    supp = tmp_path / "s.supp"
    supp.write_text(f"# a comment\n\n  {rule}   # trailing comment\n")
    doc = json.loads(report("--format", "json", "--suppressions", str(supp), synth[0]).stdout)
    assert doc["processes"][0]["summary"]["suppressed"] == suppressed


# --- a real run ------------------------------------------------------------------------

REAL_SCRIPT = '''\
import dlconsumer as C
import dlproducer as P


def leak_one(n):
    C.consume_leak(P.good(n))  # <-- leak


def main():
    cap = P.good(8)  # <-- export
    C.double_delete(cap)  # <-- delete
    for n in (4, 4, 4):
        leak_one(n)


main()
'''


def normalise(text):
    """Golden form of a real report: pids, addresses, the fixtures' line numbers
    and the script's directory normalised; native frames outside the fixtures
    (the interpreter's, which differ between builds) dropped and the rest
    renumbered."""
    out, k = [], 0
    for line in text.splitlines():
        line = re.sub(r"==\d+==", "==PID==", line)
        line = re.sub(r"process \d+ \(\S+", "process PID (PYTHON", line)
        line = re.sub(r"0x[0-9a-f]+", "0xADDR", line)
        line = re.sub(r"/\S*/(prog_\d+\.py)", r"\1", line)
        m = re.match(r"    #\d+ (.*)", line)
        if m:
            frame = m.group(1)
            if frame.startswith("0xADDR"):
                if "tests/fixtures/" not in frame:
                    continue
                frame = re.sub(r"(tests/fixtures/\w+\.c):\d+", r"\1:LINE", frame)
            line = f"    #{k} {frame}"
            k += 1
        else:
            k = 0
        out.append(line)
    return "\n".join(out) + "\n"


def test_real_run_golden_and_contract(tmp_path):
    require_runtime()
    script = tmp_path / "prog_0.py"
    script.write_text(REAL_SCRIPT)
    env = base_env({"CAPSAN_OPTIONS": "protect=1"})
    cp = subprocess.run([str(CAPSAN_RUN), "run", "--log-path", str(tmp_path / "t"), "--", str(STATIC_PY), str(script)],
                        capture_output=True, text=True, env=env, timeout=120, preexec_fn=no_core,
                        cwd=tmp_path)
    assert cp.returncode == 23, cp.stderr
    traces = sorted(tmp_path.glob("t.[0-9]*"))
    assert len(traces) == 1, traces
    r = report(str(traces[0]))
    assert r.returncode == 0, r.stderr
    golden("report_real.txt", normalise(r.stdout))
    # JSON: the contract, and Python frames at the marked lines
    doc = json.loads(report("--format", "json", str(traces[0])).stdout)
    check_contract(doc)
    fs = doc["processes"][0]["findings"]
    assert sorted(f["kind"] for f in fs) == ["dlpack-double-delete", "dlpack-leak", "dlpack-leak",
                                            "dlpack-leak"]
    # suppression lines for the real stacks name the fixture's functions, and work
    g = report("--gen-suppressions", str(traces[0])).stdout
    lines = [l for l in g.splitlines() if l and not l.startswith("#")]
    assert lines[0] == "dlpack-double-delete:^double_delete$", g
    assert len(lines) == 2 and lines[1].startswith("dlpack-leak:"), g
    (tmp_path / "real.supp").write_text(g)
    doc = json.loads(report("--format", "json", "--suppressions", str(tmp_path / "real.supp"),
                            str(traces[0])).stdout)
    assert doc["processes"][0]["findings"] == [] and doc["processes"][0]["summary"]["suppressed"] == 4


def test_the_runs_own_suppressions(tmp_path):
    """Without --suppressions the report applies the file the run used (its
    OPTIONS record), so it shows what the live report showed."""
    supp = tmp_path / "run.supp"
    supp.write_text("leak:*\n")
    data = parent_trace().replace(rec(REC_OPTIONS, cstr("log_path=capsan.trace")),
                                  rec(REC_OPTIONS, cstr(f"log_path=capsan.trace:suppressions={supp}")))
    p = write(tmp_path, data, "withsupp")
    doc = json.loads(report("--format", "json", p).stdout)
    assert [f["kind"] for f in doc["processes"][0]["findings"]] == ["dlpack-double-delete"]
    assert doc["processes"][0]["summary"]["suppressed"] == 3
    text = report(p).stdout
    assert "Suppressions used:" in text and "leak:*" in text
    # a flag wins over the run's file
    other = tmp_path / "other.supp"
    other.write_text("dlpack-double-delete:*\n")
    doc = json.loads(report("--format", "json", "--suppressions", str(other), p).stdout)
    assert sorted(f["kind"] for f in doc["processes"][0]["findings"]) == ["dlpack-leak", "dlpack-leak",
                                                                         "numpy-leak"]
    # gone since the run: said, and nothing suppressed
    supp.unlink()
    r = report("--format", "json", p)
    assert r.returncode == 0 and "the run's suppressions are not applied" in r.stderr
    assert len(json.loads(r.stdout)["processes"][0]["findings"]) == 4


# --- paths: strip_path_prefix, and the SUMMARY's location ------------------------------

def test_strip_path_prefix_and_summary_location(tmp_path):
    """As ASan's strip_path_prefix: live, in the report (the run's own
    setting), overridden by --strip-path-prefix; SUMMARY ends with the
    first error's kind and Python file:line."""
    from conftest import SCENARIOS, marker_line, run_capsan
    script = SCENARIOS / "dl_leak.py"
    line = marker_line(script, "consume")
    prefix = str(SCENARIOS.parent) + "/"
    res = run_capsan(script, tmp_path, args=["consumed"], options=[f"strip_path_prefix={prefix}"])
    assert res.returncode == 23, res.describe()
    first = f"First: dlpack-leak at scenarios/dl_leak.py:{line} in <module>."
    assert f" scenarios/dl_leak.py:{line} in <module>" in res.stderr, res.stderr[-3000:]
    assert prefix + "scenarios" not in res.stderr, res.stderr[-3000:]
    assert re.search(r"^SUMMARY: capsan: 1 error\(s\).*\. " + re.escape(first) + "$", res.stderr,
                     re.M), res.stderr[-1500:]
    text = report(*map(str, res.traces)).stdout
    frames = [l for l in text.splitlines() if l.startswith("    #")]
    assert first in text and frames and not any(prefix in l for l in frames), text[-2000:]
    text = report("--strip-path-prefix", "/tests/", *map(str, res.traces)).stdout
    assert f"First: dlpack-leak at scenarios/dl_leak.py:{line} in <module>." in text
    # a prefix found nowhere changes nothing
    text = report("--strip-path-prefix", "/nowhere/", *map(str, res.traces)).stdout
    assert f"First: dlpack-leak at {SCENARIOS}/dl_leak.py:{line} in <module>." in text, text[-1500:]
