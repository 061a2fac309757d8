"""The docs run as written: README.md and every docs/*.md page.

- Commands: every line of a ```sh block runs, page by page in a scratch
  directory of its own (the blocks of a page in order, so a later command
  reads the traces an earlier one left), with `capsan` the checkout's
  build/bin/capsan and `python`/`python3` Debian's /usr/bin/python3 on
  PATH, `pytest` a console script for it, PYTHONPATH=build/python (as an
  install would have it) and `build`, `examples` linked into the scratch
  directory (so checkout paths such as build/lib/libcapsan.so resolve).
  `your_prog.py` and `tests/` there are placeholders: a clean program and
  a clean test. A command must exit 0, or N when its comment says
  "(exit status N)". `make ...` runs in the checkout. Commands that need
  the network, write outside the scratch directory or take minutes are
  not run: NOT_RUN says why and which test covers them, and each one is
  listed as a skip (pytest -rs).
- Python: a ```python block whose first line is `# file: NAME` is written
  to NAME in the page's scratch directory (a later command runs it); any
  other runs as a script and must exit 0 and print something.
- The sample reports: a ```text block after `<!-- docs-test:
  make-demo-output -->` must be what `make demo` prints: examples/demo.sh
  runs (what `make demo` runs after its build), and each run of the
  block's lines between `...` lines must appear in its output, in order,
  after pids, addresses, build ids and the checkout's path are
  normalised.
- Tables: the README's and docs/findings.md's kinds are model/kinds.inc's
  (the README's meanings are its one-liners); docs/options.md lists every
  option of model/options.inc with its default.
- Links: every docs/*.md page is linked from README.md, every relative
  link resolves (anchors too), every checkout path named in backticks
  exists, and README.md is at most 210 lines.
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

from conftest import BUILD, CAPSAN, ROOT, STATIC_PY, contract_kinds, require

PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
README_MAX_LINES = 210
TIMEOUT = 300

# Commands the docs show that this file does not run: (pattern, reason).
NOT_RUN = [
    (r"^pip install \.", "tests/test_install.py installs the checkout into a fresh venv "
                         "(make test for cp311, make test-install for every CPython)"),
    (r"^pip install \S*\.whl", "tests/test_wheel.py installs the wheel into a fresh venv "
                               "(make test, make test-wheel)"),
    (r"^make demo$", "runs .ci/deps (apt) and the build; test_demo_sample runs examples/demo.sh, "
                     "what make demo runs after them, and checks its output"),
    (r"^make test$", "the whole suite, this file included"),
    (r"^make install\b", "writes into PREFIX; tests/test_install.py runs make install into a "
                         "temporary PREFIX"),
    (r"^make wheel$", "a multi-minute build (.ci/wheel); tests/test_wheel.py (make test) uses it"),
    (r"^make test-wheel$", "builds the wheel (minutes), then tests/test_wheel.py: part of make test"),
    (r"^make test-install$", "tests/test_install.py for every CPython: fresh venvs, minutes"),
    (r"^make test-realworld$", "tests/test_realworld.py (part of make test): needs make "
                               "realworld-venvs (the network, once)"),
    (r"^make check-numpy$", "numpy's own suites under capsan: about 25 minutes"),
    (r"^make check-upstream$", "upstream suites under capsan: about 4 minutes, and their files "
                               "come from the network (once, cached)"),
    (r"^make (bench|bench-quick|bench-floor)$", "benchmarks: minutes under callgrind"),
    (r"^make test-repeat\b", "every scenario 20 times beside a CPU hog: about half an hour "
                              "(make test runs its short form: test_repeat.py)"),
    (r"^make (fuzz|asan|stress)\b", "multi-minute hardening runs (make test runs their short "
                                    "forms: test_sanitizers.py, test_stress.py, the fuzz "
                                    "regressions)"),
    (r"^cd tests && .*test_docs\.py$", "runs this file"),
]

YOUR_PROG = '''import numpy as np
a = np.ones(1000)
b = np.from_dlpack(a)          # a DLPack exchange, done right
print("sum", float(a.sum() + b.sum()))
'''
PLACEHOLDER_TEST = '''import numpy as np


def test_clean():
    assert np.ones(10).sum() == 10
'''
PYTEST_SCRIPT = '''#!/usr/bin/python3
import sys
import pytest
sys.exit(pytest.console_main())
'''

MARKER = re.compile(r"<!--\s*docs-test:\s*(.*?)\s*-->")
FENCE = re.compile(r"^```(\w*)\s*$")
STATUS = re.compile(r"\(exit status (\d+)\)")


@dataclass
class Block:
    page: Path
    line: int          # 1-based line of the opening fence
    lang: str
    text: str
    marker: str | None

    @property
    def where(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}"


def blocks(page: Path) -> list[Block]:
    lines = page.read_text().split("\n")
    out, i = [], 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        start = i
        j = i + 1
        while j < len(lines) and lines[j].strip() != "```":
            j += 1
        marker = None
        k = start - 1
        while k >= 0 and not lines[k].strip():
            k -= 1
        if k >= 0 and MARKER.search(lines[k]):
            marker = MARKER.search(lines[k]).group(1)
        out.append(Block(page, start + 1, m.group(1), "\n".join(lines[start + 1:j]), marker))
        i = j + 1
    return out


def commands(block: Block) -> list[tuple[int, str, str]]:
    """(line, command line, its comment) of a sh block."""
    out = []
    for n, raw in enumerate(block.text.split("\n")):
        s = raw.strip()
        if not s or s.startswith("#"):
            continue
        m = re.search(r"\s#\s", " " + s)
        cmd, comment = (s, "") if not m else (s[:m.start() - 1].rstrip(), s[m.start():])
        out.append((block.line + 1 + n, cmd, comment))
    return out


def not_run_reason(cmd: str) -> str | None:
    for pat, reason in NOT_RUN:
        if re.search(pat, cmd):
            return reason
    if cmd.startswith("jq") or "| jq" in cmd:
        if shutil.which("jq") is None:
            return "jq is not installed"
    return None


ALL_BLOCKS = [b for p in PAGES for b in blocks(p)]
SKIPPED = [(b, ln, cmd, not_run_reason(cmd)) for b in ALL_BLOCKS if b.lang == "sh"
           for ln, cmd, _ in commands(b) if not_run_reason(cmd)]


def scratch(tmp: Path) -> dict:
    """The scratch directory and the environment the docs' commands see."""
    require(CAPSAN, BUILD / "lib" / "libcapsan.so", BUILD / "python" / "capsan" / "__init__.py")
    binp = tmp / ".bin"
    binp.mkdir()
    (binp / "capsan").symlink_to(CAPSAN)
    for name in ("python", "python3"):
        (binp / name).symlink_to(STATIC_PY)
    (binp / "pytest").write_text(PYTEST_SCRIPT)
    (binp / "pytest").chmod(0o755)
    (tmp / "build").symlink_to(BUILD)
    (tmp / "examples").symlink_to(ROOT / "examples")
    (tmp / "your_prog.py").write_text(YOUR_PROG)
    (tmp / "tests").mkdir()
    (tmp / "tests" / "test_placeholder.py").write_text(PLACEHOLDER_TEST)
    env = dict(os.environ)
    for k in ("LD_PRELOAD", "CAPSAN_OPTIONS", "CAPSAN_LIB", "PYTHONHOME", "PYTHONSTARTUP",
              "VIRTUAL_ENV", "PYTEST_PLUGINS"):
        env.pop(k, None)
    env["PATH"] = f"{binp}:{env.get('PATH', '/usr/bin:/bin')}"
    env["PYTHONPATH"] = str(BUILD / "python")
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    env["PYTEST_ADDOPTS"] = "-p no:cacheprovider"
    env["OMP_NUM_THREADS"] = "1"
    return env


def run_sh(cmd: str, cwd: Path, env: dict) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", "-c", cmd], cwd=str(cwd), env=env, capture_output=True,
                          text=True, timeout=TIMEOUT, stdin=subprocess.DEVNULL)


def tail(s: str, n: int = 3000) -> str:
    return s if len(s) <= n else "..." + s[-n:]


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_page_runs(page, tmp_path):
    """Every command and Python snippet of the page, in order."""
    env = scratch(tmp_path)
    failures = []
    for b in blocks(page):
        if b.marker and b.marker.startswith("not run"):
            continue
        if b.lang == "python":
            first = b.text.split("\n", 1)[0]
            m = re.match(r"#\s*file:\s*(\S+)\s*$", first)
            if m:
                (tmp_path / m.group(1)).write_text(b.text.split("\n", 1)[1] + "\n")
                continue
            script = tmp_path / f"snippet_{b.line}.py"
            script.write_text(b.text + "\n")
            cp = run_sh(f"python {script.name}", tmp_path, env)
            if cp.returncode != 0 or not cp.stdout.strip():
                failures.append(f"{b.where}: the Python snippet exited {cp.returncode} and printed "
                                f"{len(cp.stdout)} bytes\nstdout: {tail(cp.stdout)}\n"
                                f"stderr: {tail(cp.stderr)}")
        elif b.lang == "sh":
            for line, cmd, comment in commands(b):
                if not_run_reason(cmd):
                    continue
                want = int(STATUS.search(comment).group(1)) if STATUS.search(comment) else 0
                cwd = ROOT if cmd.split()[0] == "make" else tmp_path
                cp = run_sh(cmd, cwd, env)
                if cp.returncode != want:
                    failures.append(f"{b.page.relative_to(ROOT)}:{line}: `{cmd}` exited "
                                    f"{cp.returncode}, the docs say {want}\n"
                                    f"stdout: {tail(cp.stdout)}\nstderr: {tail(cp.stderr)}")
    assert not failures, "\n\n".join(failures)


@pytest.mark.parametrize("block,line,cmd,reason", SKIPPED,
                         ids=[f"{b.page.relative_to(ROOT)}:{ln}" for b, ln, _, _ in SKIPPED])
def test_command_not_run(block, line, cmd, reason):
    """Listed, with the reason, so that what is not run here is visible."""
    pytest.skip(f"not run: `{cmd}`: {reason}")


def test_not_run_rules_are_used():
    """A rule no command of the docs matches any more is stale."""
    cmds = [cmd for b in ALL_BLOCKS if b.lang == "sh" for _, cmd, _ in commands(b)]
    unused = [pat for pat, _ in NOT_RUN if not any(re.search(pat, c) for c in cmds)]
    assert not unused, f"NOT_RUN rules that match no command in the docs: {unused}"


# ---- the sample reports ------------------------------------------------------

def normalise(line: str) -> str:
    line = re.sub(r"\x1b\[[0-9;]*m", "", line).rstrip()
    line = re.sub(r"==\d+==", "==PID==", line)
    line = re.sub(r"\bprocess \d+\b", "process PID", line)
    line = re.sub(r"BuildId: [0-9a-f]+", "BuildId: ID", line)
    line = re.sub(r"0x[0-9a-f]+", "0xADDR", line)
    # the checkout's path: whatever leads to its examples/ or build/
    line = re.sub(r"(?<![\w.-])/[\w/.+-]*?/(?=(?:examples|build)/)", "ROOT/", line)
    return line


@pytest.fixture(scope="module")
def demo_output():
    require(CAPSAN, BUILD / "lib" / "libcapsan.so", BUILD / "tests" / "dlproducer.so",
            BUILD / "tests" / "dlconsumer.so")
    env = dict(os.environ)
    for k in ("LD_PRELOAD", "CAPSAN_OPTIONS", "PYTHONPATH"):
        env.pop(k, None)
    cp = subprocess.run(["bash", str(ROOT / "examples" / "demo.sh")], cwd=str(ROOT), env=env,
                        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                        timeout=TIMEOUT, stdin=subprocess.DEVNULL)
    assert cp.returncode == 0, tail(cp.stdout, 6000)
    return [normalise(x) for x in cp.stdout.split("\n")]


SAMPLES = [b for b in ALL_BLOCKS if b.marker == "make-demo-output"]


def test_readme_has_a_sample_report():
    assert any(b.page.name == "README.md" for b in SAMPLES), \
        "README.md has no ```text block marked <!-- docs-test: make-demo-output -->"


@pytest.mark.parametrize("block", SAMPLES, ids=[b.where for b in SAMPLES])
def test_demo_sample(block, demo_output):
    """The sample is make demo's output, trimmed only at its `...` lines."""
    segments, cur = [], []
    for raw in block.text.split("\n"):
        if raw.strip() == "...":
            segments.append(cur)
            cur = []
        else:
            cur.append(normalise(raw))
    segments.append(cur)
    pos = 0
    for seg in segments:
        if not seg:
            continue
        for i in range(pos, len(demo_output) - len(seg) + 1):
            if demo_output[i:i + len(seg)] == seg:
                pos = i + len(seg)
                break
        else:
            near = [i for i in range(pos, len(demo_output)) if demo_output[i] == seg[0]]
            ctx = demo_output[near[0]:near[0] + len(seg)] if near else demo_output[pos:pos + 12]
            pytest.fail(f"{block.where}: these lines are not in make demo's output (after line "
                        f"{pos}):\n" + "\n".join(seg) + "\n--- make demo printed, there:\n"
                        + "\n".join(ctx))


# ---- tables ----------------------------------------------------------------------

def table_rows(text: str, first_header: str) -> list[list[str]]:
    """The rows of every table whose first header cell is `first_header`."""
    rows, inside = [], False
    for line in text.split("\n"):
        if not line.startswith("|"):
            inside = False
            continue
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if cells[0] == first_header:
            inside = True
            continue
        if inside and not set(cells[0]) <= set("-: "):
            rows.append(cells)
    return rows


def kinds_inc_meanings() -> dict:
    text = (ROOT / "model" / "kinds.inc").read_text()
    return {m.group(1): re.sub(r'"\s*"', "", m.group(2))
            for m in re.finditer(r'KIND\(\w+,\s*"([^"]+)",\s*CS_SEV_\w+,\s*"((?:[^"]|"\s*")*)"\)',
                                 text)}


@pytest.mark.parametrize("page", ["README.md", "docs/findings.md"])
def test_kinds_table(page):
    rows = table_rows((ROOT / page).read_text(), "kind")
    got = {r[0].strip("`"): r[1] for r in rows}
    want = dict(contract_kinds())
    assert got == want, (f"{page}'s kinds table differs from model/kinds.inc: missing "
                         f"{sorted(set(want) - set(got))}, extra {sorted(set(got) - set(want))}, "
                         f"severity {[(k, got[k], want[k]) for k in got if k in want and got[k] != want[k]]}")
    assert len(rows) == len(got), f"{page} lists a kind twice"
    if page == "README.md":
        meanings = kinds_inc_meanings()
        assert set(meanings) == set(want)
        wrong = [(r[0], r[2], meanings[r[0].strip("`")]) for r in rows
                 if r[2] != meanings[r[0].strip("`")]]
        assert not wrong, f"README.md's meanings are not model/kinds.inc's one-liners: {wrong}"


def test_options_table():
    text = (ROOT / "model" / "options.inc").read_text()
    inc = {m.group(2): m.group(3).strip().strip('"')
           for m in re.finditer(r'OPT\((\w+),\s*(\w+),\s*("[^"]*"|[-\d]+)', text)}
    rows = table_rows((ROOT / "docs" / "options.md").read_text(), "option")
    got = {r[0].strip("`"): r[1].strip("`") for r in rows}
    assert set(got) == set(inc), (f"docs/options.md: missing {sorted(set(inc) - set(got))}, "
                                  f"extra {sorted(set(got) - set(inc))}")
    wrong = [(k, got[k], v) for k, v in inc.items() if got[k] != (v or "(none)")]
    assert not wrong, f"docs/options.md's defaults differ from model/options.inc: {wrong}"


# ---- links ------------------------------------------------------------------------

def slug(heading: str) -> str:
    """GitHub's anchor of a heading."""
    s = heading.strip().lower()
    s = re.sub(r"[^\w\- ]", "", s)
    return s.replace(" ", "-")


def anchors(page: Path) -> set:
    out, fenced = set(), False
    for line in page.read_text().split("\n"):
        if line.startswith("```"):
            fenced = not fenced
        elif not fenced and line.startswith("#"):
            out.add(slug(line.lstrip("#")))
    return out


def links(page: Path) -> list[str]:
    text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)
    return re.findall(r"\[[^\]]*\]\(([^)\s]+)\)", text)


def test_every_page_is_linked_from_the_readme():
    linked = {(ROOT / t.split("#")[0]).resolve() for t in links(ROOT / "README.md")
              if not re.match(r"\w+:", t)}
    orphans = [p.name for p in PAGES[1:] if p.resolve() not in linked]
    assert not orphans, f"docs pages README.md does not link: {orphans}"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_links_resolve(page):
    bad = []
    for target in links(page):
        if re.match(r"\w+:", target):
            continue
        path, _, anchor = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        if not dest.exists():
            bad.append(f"{target}: no such file")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            bad.append(f"{target}: no heading #{anchor} in {dest.relative_to(ROOT)}")
    assert not bad, f"{page.relative_to(ROOT)}: " + "; ".join(bad)


CHECKOUT_PATH = re.compile(r"`((?:\.ci|preload|model|reports|tests|bench|pyhook|examples|docs)/"
                           r"[^`\s*]+)`")


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_named_paths_exist(page):
    """A file or folder of the checkout named in backticks exists."""
    missing = sorted({p for p in CHECKOUT_PATH.findall(page.read_text())
                      if not (ROOT / p.rstrip("/")).exists()})
    assert not missing, f"{page.relative_to(ROOT)} names paths the checkout lacks: {missing}"


def test_readme_is_short():
    n = len((ROOT / "README.md").read_text().rstrip("\n").split("\n"))
    assert n <= README_MAX_LINES, f"README.md has {n} lines (at most {README_MAX_LINES})"
