"""Suppressions that mean one thing (issue 34, item 2): one matcher serves
the live run and `capsan report`, so a file gives the same result in both,
function and source-file patterns included (the live run asks `capsan
symbolize` for the DWARF names its own symbol tables lack); generated
lines name the program's own function or module and suppress exactly the
findings they were made from."""
import json
import subprocess

import pytest

from conftest import CAPSAN, capsan_report, findings, run_capsan

PROG = '''\
import dlconsumer as C
import dlproducer as P


def checksum(n):
    C.consume_leak(P.good(n))  # <-- leak


def main():
    cap = P.good(8)
    C.double_delete(cap)  # <-- delete
    checksum(4)


main()
'''

OTHER = '''\
import dlconsumer as C
import dlproducer as P


def elsewhere(n):
    C.consume_leak(P.good(n))


elsewhere(4)
'''


def suppressed_live_and_offline(tmp_path, rule, tag):
    supp = tmp_path / f"{tag}.supp"
    supp.write_text(rule + "\n")
    res = run_capsan(PROG, tmp_path / tag, options=[f"suppressions={supp}", "protect=1"])
    live = 2 - len(findings(res.report))
    # the report replays the trace without the run's suppressions file
    plain = tmp_path / "plain.supp"
    plain.write_text("# nothing\n")
    _, rep = capsan_report(res.traces, extra_args=["--suppressions", plain])
    assert len(findings(rep)) == 2, findings(rep)
    _, rep = capsan_report(res.traces, extra_args=["--suppressions", supp])
    offline = rep["processes"][0]["summary"]["suppressed"]
    return res, live, offline


@pytest.mark.parametrize("rule,expect", [
    ("dlpack-leak:checksum", 1),          # the program's Python function
    ("dlpack-leak:consume_leak", 1),      # a native function of the extension
    ("dlpack-leak:^take$", 1),            # a static function inlined into consume_leak (DWARF)
    ("*:dlconsumer.c", 2),                # the extension's source file (DWARF)
    ("*:dlconsumer.so", 2),               # its module
    ("dlpack-double-delete:^main$", 1),
    ("leak:nothing_like_this", 0),
])
def test_live_and_report_agree(tmp_path, rule, expect):
    res, live, offline = suppressed_live_and_offline(tmp_path, rule, "r")
    assert (live, offline) == (expect, expect), (rule, live, offline, res.stderr[-3000:])
    # the exit status follows what was left: no error, no 23
    assert (res.returncode == 23) == (expect < 2), (res.returncode, res.stderr[-2000:])
    if expect:
        assert "Suppressions used:" in res.stderr and rule in res.stderr, res.stderr[-2000:]


def test_generated_lines_suppress_exactly_their_findings(tmp_path):
    res = run_capsan(PROG, tmp_path / "gen", options=["protect=1"])
    assert sorted(f["kind"] for f in findings(res.report)) == ["dlpack-double-delete",
                                                               "dlpack-leak"], res.describe()
    cp = subprocess.run([str(CAPSAN), "report", "--gen-suppressions", *map(str, res.traces)],
                        capture_output=True, text=True, timeout=120)
    assert cp.returncode == 0, cp.stderr
    lines = sorted(l for l in cp.stdout.splitlines() if l and not l.startswith("#"))
    # a leak is named where it was made (the producer fixture's own static
    # function), a double delete at its last event's innermost own frame
    # (the consumer's function); never CPython's or capsan's frames
    assert lines == ["dlpack-double-delete:^double_delete$", "dlpack-leak:^wrap$"], cp.stdout
    supp = tmp_path / "gen.supp"
    supp.write_text(cp.stdout)
    again = run_capsan(PROG, tmp_path / "again", options=[f"suppressions={supp}", "protect=1"])
    assert again.returncode == 0 and findings(again.report) == [], again.describe()
    _, rep = capsan_report(res.traces, extra_args=["--suppressions", supp])
    assert findings(rep) == [] and rep["processes"][0]["summary"]["suppressed"] == 2
    # a Python-level pattern for the program's own function: the leak made
    # elsewhere is not covered by `^checksum$`
    supp.write_text("dlpack-leak:^checksum$\n")
    other = run_capsan(OTHER, tmp_path / "other", options=[f"suppressions={supp}"])
    assert [f["kind"] for f in findings(other.report)] == ["dlpack-leak"], other.describe()
    assert other.returncode == 23
