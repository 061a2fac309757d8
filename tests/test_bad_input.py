"""Every option, environment variable and file input of `capsan run` and
`capsan report`, mistyped the way a user would (issue 14, part 5): each
gets a clear error naming the input, before anything is started or
overwritten, and nothing recorded is lost."""
import subprocess

import pytest

from conftest import CAPSAN, base_env, capsan_report, kinds, require_runtime, run_capsan, trace_files

LEAK = ("import dlconsumer as C, dlproducer as P\n"
        "C.consume_leak(P.good(4))\n"
        "print('ran', flush=True)\n")


def capsan(*args, env=None, cwd=None):
    require_runtime()
    return subprocess.run([str(CAPSAN), *map(str, args)], capture_output=True, text=True,
                          timeout=60, env=env or base_env(), cwd=cwd, stdin=subprocess.DEVNULL)


def refused(r, *words):
    """Exit status 2 (usage), one 'capsan:' message naming what was wrong."""
    assert r.returncode == 2, (r.returncode, r.stdout[-500:], r.stderr)
    for w in words:
        assert w in r.stderr, (w, r.stderr)
    assert r.stderr.startswith("capsan: "), r.stderr


@pytest.fixture(scope="module")
def trace(tmp_path_factory):
    """A real trace with one dlpack-leak."""
    tmp = tmp_path_factory.mktemp("trace")
    res = run_capsan(LEAK, tmp)
    assert res.returncode == 23 and kinds(res.report) == {"dlpack-leak"}, res.describe()
    (t,) = res.traces
    return t


# ---------------------------------------------------------------- capsan run

def not_started(tmp_path, *flags, env=None):
    """capsan run FLAGS -- a command that would leave a marker; the marker
    must not exist afterwards."""
    marker = tmp_path / "started"
    r = capsan("run", *flags, "--", "/bin/sh", "-c", f"touch {marker}", env=env)
    assert not marker.exists(), f"the command ran: {flags}\n{r.stderr}"
    return r


def test_run_log_path_in_a_missing_directory(tmp_path):
    missing = tmp_path / "no" / "such"
    refused(not_started(tmp_path, "--log-path", missing / "t"), str(missing), "No such file")
    # the same from CAPSAN_OPTIONS
    env = base_env({"CAPSAN_OPTIONS": f"log_path={missing}/t"})
    refused(not_started(tmp_path, env=env), str(missing))


def test_run_log_path_under_a_file_or_unwritable(tmp_path):
    f = tmp_path / "file"
    f.write_text("x")
    refused(not_started(tmp_path, "--log-path", f / "t"), f"{f} is not a directory")
    # a directory no one may create files in (even root: the kernel's /proc/1)
    refused(not_started(tmp_path, "--log-path", "/proc/1/t"), "cannot create files in /proc/1")


@pytest.mark.parametrize("slash", ["", "/"])
def test_run_log_path_naming_a_directory(tmp_path, slash):
    r = not_started(tmp_path, "--log-path", f"{tmp_path}{slash}")
    refused(r, "is a directory", f"try {tmp_path}/capsan.trace")
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")], "hidden traces made"


def test_run_relative_log_path_still_works(tmp_path):
    (tmp_path / "prog.py").write_text(LEAK)
    r = capsan("run", "--log-path", "t", "--", "/usr/bin/python3", "prog.py", cwd=tmp_path)
    assert r.returncode == 23 and "ran" in r.stdout, r.stderr
    (t,) = trace_files(tmp_path)
    assert kinds(capsan_report([t])[1]) == {"dlpack-leak"}


def test_run_empty_command_name(tmp_path):
    refused(capsan("run", "--", ""), "an empty command name")


def test_run_bad_capsan_options_all_named(tmp_path):
    env = base_env({"CAPSAN_OPTIONS": "exitcode=300:no_such_key=1:log_path=:report=xml"})
    r = not_started(tmp_path, env=env)
    refused(r, "'exitcode'", "'no_such_key'", "'log_path'", "'report'", "CAPSAN_OPTIONS")
    assert len([ln for ln in r.stderr.splitlines() if ln.startswith("capsan: run:")]) == 4, r.stderr


def test_run_suppressions_missing_bad_or_a_directory(tmp_path):
    bad = tmp_path / "bad.supp"
    bad.write_text("# one good line, then one without a colon\ndlpack-leak:foo\ndlpack-leak\n")
    refused(not_started(tmp_path, "--options", f"suppressions={tmp_path}/nope.supp"),
            "nope.supp", "No such file")
    refused(not_started(tmp_path, env=base_env({"CAPSAN_OPTIONS": f"suppressions={bad}"})),
            f"{bad}:3", "expected KIND:pattern")
    refused(not_started(tmp_path, "--options", f"suppressions={tmp_path}"), "is a directory")


def test_runtime_names_a_suppressions_directory(tmp_path):
    """Without capsan run (LD_PRELOAD), a directory given as suppressions
    used to load as an empty file, silently; now it is named, and the
    program runs with the finding reported."""
    res = run_capsan(LEAK, tmp_path, mode="preload", options=[f"suppressions={tmp_path}"])
    assert "is a directory, not a suppressions file" in res.stderr, res.stderr
    assert res.returncode == 23 and "ran" in res.stdout, res.describe()


def test_run_killed_without_a_trace_says_so(tmp_path):
    prefix = tmp_path / "t"
    r = capsan("run", "--log-path", prefix, "--", "/bin/sh", "-c", "kill -TERM $$")
    assert r.returncode == 128 + 15, r.stderr
    assert "left no trace" in r.stderr and "trace: " not in r.stderr, r.stderr
    # with a trace, it is named, and it is there
    code = ("import os, signal, dlconsumer as C, dlproducer as P\n"
            "C.consume_leak(P.good(4))\n"
            "os.kill(os.getpid(), signal.SIGTERM)\n")
    (tmp_path / "prog.py").write_text(code)
    r = capsan("run", "--log-path", prefix, "--", "/usr/bin/python3", tmp_path / "prog.py")
    assert r.returncode == 128 + 15, r.stderr
    (t,) = trace_files(tmp_path)
    assert f"trace: {t}" in r.stderr, r.stderr


# ---------------------------------------------------------------- capsan report

def test_report_a_directory_or_a_missing_file_among_traces(tmp_path, trace):
    for other in (tmp_path, tmp_path / "missing.123"):
        r = capsan("report", "--format", "json", other, trace)
        assert r.returncode == 1, r.stderr
        assert str(other) in r.stderr
        if other == tmp_path:
            assert "is a directory, not a trace file" in r.stderr, r.stderr
        # the readable trace is still reported in full
        assert '"kind": "dlpack-leak"' in r.stdout, r.stdout[-1000:]


def test_report_output_in_a_missing_directory(tmp_path, trace):
    out = tmp_path / "no" / "such" / "r.html"
    refused(capsan("report", "--format", "html", "-o", out, trace),
            str(out), f"directory {out.parent} does not exist")
    refused(capsan("report", "-o", "/proc/1/report.txt", trace), "/proc/1/report.txt")


def test_report_output_never_overwrites_a_trace(tmp_path, trace):
    mine = tmp_path / "t.1"
    other = tmp_path / "t.2"
    data = trace.read_bytes()
    mine.write_bytes(data)
    other.write_bytes(data)
    # -o naming a trace being read: it would be truncated before it is read
    refused(capsan("report", "-o", mine, mine), "is also a trace to report")
    # `capsan report -o capsan.trace.*`: the shell made a trace the output
    refused(capsan("report", "-o", other, mine), "is a capsan trace", "refusing to overwrite")
    assert mine.read_bytes() == data and other.read_bytes() == data
    # an old report is replaced as before
    out = tmp_path / "r.txt"
    out.write_text("old report\n")
    r = capsan("report", "-o", out, mine)
    assert r.returncode == 0 and "dlpack-leak" in out.read_text(), r.stderr


def test_report_empty_names(tmp_path, trace):
    refused(capsan("report", "-o", "", trace), "-o needs a file name")
    refused(capsan("report", "--output=", trace), "--output needs a file name")
    refused(capsan("report", "--suppressions", "", trace), "--suppressions needs a file name")
    refused(capsan("report", ""), "an empty trace file name")
    refused(capsan("report", "-"), "not from standard input")


def test_report_suppressions_missing_bad_or_a_directory(tmp_path, trace):
    bad = tmp_path / "bad.supp"
    bad.write_text("dlpack-leak:ok\nnot-a-kind:foo\n")
    refused(capsan("report", "--suppressions", tmp_path / "nope", trace), "nope", "No such file")
    refused(capsan("report", "--suppressions", bad, trace), f"{bad}:2", "unknown finding kind")
    refused(capsan("report", "--suppressions", tmp_path, trace), "is a directory")


def test_report_skips_json_reports_a_glob_picked_up(tmp_path, trace):
    """report=json leaves log_path.PID.json beside log_path.PID, and
    `capsan report capsan.trace.*` matches both."""
    t = tmp_path / "capsan.trace.7"
    t.write_bytes(trace.read_bytes())
    j = tmp_path / "capsan.trace.7.json"
    j.write_text(capsan("report", "--format", "json", t).stdout)
    r = capsan("report", t, j)
    assert r.returncode == 0, r.stderr
    assert f"{j} is a JSON report (report=json), not a trace: skipped" in r.stderr, r.stderr
    assert "ERROR: capsan: dlpack-leak" in r.stdout


def test_report_to_a_full_device(trace):
    r = capsan("report", "-o", "/dev/full", trace)
    assert r.returncode == 1 and "writing /dev/full failed: No space left" in r.stderr, r.stderr


@pytest.mark.parametrize("typed, meant", [("verbose", "verbosity"), ("log_pth", "log_path"),
                                          ("halt", "halt_on_error"), ("exitcod", "exitcode"),
                                          ("python_dept", "python_depth")])
def test_a_mistyped_option_gets_a_did_you_mean(typed, meant):
    """As ASan's flag parser does: the nearest option is named, in the
    runtime's parser (CAPSAN_OPTIONS) and capsan run's (--options)."""
    env = base_env({"CAPSAN_OPTIONS": f"{typed}=1"})
    refused(capsan("run", "--", "true", env=env), f"unknown option '{typed}'",
            f"did you mean '{meant}'?")
    refused(capsan("run", "--options", f"{typed}=1", "--", "true"), f"did you mean '{meant}'?")


def test_an_unknown_option_far_from_any_gets_no_guess():
    env = base_env({"CAPSAN_OPTIONS": "frobnicate=1"})
    r = capsan("run", "--", "true", env=env)
    refused(r, "unknown option 'frobnicate'")
    assert "did you mean" not in r.stderr


def test_help_options_columns_line_up():
    """Every option's type starts in the same column, the long names too."""
    r = capsan("help-options")
    rows = [ln for ln in r.stdout.splitlines() if ln.startswith("  ")]
    assert len(rows) > 10
    cols = {ln.index(" default ") for ln in rows}
    assert len(cols) == 1, r.stdout


@pytest.mark.parametrize("what", ["missing", "not-executable"])
def test_a_program_that_cannot_run_gets_its_one_line(tmp_path, what):
    """The error, its status (127, 126 as a shell's), and nothing after it:
    no 'no findings' line for a program that never ran."""
    prog = tmp_path / "prog.py"
    if what == "not-executable":
        prog.write_text("print(1)\n")
        prog.chmod(0o644)
    r = capsan("run", "--", prog, cwd=tmp_path)
    assert r.returncode == (127 if what == "missing" else 126), r.stderr
    assert r.stderr.splitlines() == [f"capsan: cannot run {prog}: " +
                                     ("No such file or directory" if what == "missing"
                                      else "Permission denied")], r.stderr
    assert not list(tmp_path.glob("capsan.trace.*"))


def test_help_option_under_capsan_run_lists_the_options_only(tmp_path):
    env = base_env({"CAPSAN_OPTIONS": "help=1"})
    r = capsan("run", "--", "/usr/bin/python3", "-c", "print('the program ran')", env=env,
               cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "log_path" in r.stdout and "the program ran" not in r.stdout
    assert "no findings" not in r.stderr, r.stderr
