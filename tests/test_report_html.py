"""`capsan report --format html`: one self-contained page, checked in real
headless Chromium (Debian's `chromium`): the page loads without console
errors, its own JavaScript self-check finds every finding card and every
plot point, hostile strings stay text, and a screenshot renders.

The traces are synthetic (struct-written, see test_reader_robust.py) so that
the expected cards and plot points are known exactly; test_report_multiproc.py
runs the same check on a real multi-process run."""
import json
import os
import re
import signal
import struct
import subprocess
import tempfile
import zlib
from pathlib import Path

import pytest

from test_reader_robust import (CAPSAN, CAPSULE, DELETER, END_EXIT, EV_CONSUME, EV_DELETE, EV_EXPORT,
                                EV_NP_ALLOC, REC_OPTIONS, START_MONO, TENSOR, code, counts, cstr, downsample, end,
                                event, frame, header, module, process, pyframe, rec, report, thread)

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync"]
CHROMIUM_TIMEOUT = 25

pytestmark = pytest.mark.skipif(not os.path.exists(CAPSAN), reason="build/bin/capsan not built")

HOSTILE_ARG = "<script>alert('x')</script>&\"q\".py"
HOSTILE_FILE = "/work/<b>bold</b>&amp;.py"


# --- Chromium -----------------------------------------------------------------

def chromium(tmp_path, url, *flags):
    """Run headless Chromium on url with a fresh profile; (returncode, stdout, stderr).
    The whole process group is killed after CHROMIUM_TIMEOUT seconds."""
    if not os.path.exists(CHROMIUM):
        pytest.fail(f"{CHROMIUM} is missing: the HTML report is tested in real Chromium "
                    "(apt-get install chromium; `make test` runs .ci/deps)", pytrace=False)
    profile = tempfile.mkdtemp(prefix="chromium-profile-", dir=tmp_path)
    cmd = [CHROMIUM, *CHROMIUM_FLAGS, f"--user-data-dir={profile}", *flags, url]
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         errors="replace", start_new_session=True)
    try:
        out, err = p.communicate(timeout=CHROMIUM_TIMEOUT)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        out, err = p.communicate()
        pytest.fail(f"chromium did not finish in {CHROMIUM_TIMEOUT}s: {' '.join(cmd)}\n{err[-3000:]}")
    return p.returncode, out, err


def console_lines(stderr):
    """What the page wrote to the console (Chromium logs it as INFO:CONSOLE)."""
    return [l for l in stderr.splitlines() if ":CONSOLE" in l]


def selfcheck(dom):
    m = re.search(r'<div id="selfcheck"([^>]*)>([^<]*)</div>', dom)
    assert m, "no #selfcheck in the DOM:\n" + dom[-2000:]
    attrs = dict(re.findall(r'(data-[\w-]+)="([^"]*)"', m.group(1)))
    return attrs, m.group(2)


def png_info(path):
    """(width, height, distinct byte values in the decompressed image data)."""
    data = Path(path).read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    pos, idat, w, h = 8, b"", 0, 0
    while pos < len(data):
        n, kind = struct.unpack(">I4s", data[pos:pos + 8])
        body = data[pos + 8:pos + 8 + n]
        if kind == b"IHDR":
            w, h = struct.unpack(">II", body[:8])
        elif kind == b"IDAT":
            idat += body
        pos += 12 + n
    return w, h, len(set(zlib.decompress(idat)))


def check_page(tmp_path, html, cards, points, shot=True):
    """Load html in Chromium: no console output at all, the self-check ran and agrees
    with `cards` finding cards and `points` points per plot series; a screenshot.
    Returns the dumped DOM."""
    url = Path(html).resolve().as_uri()
    rc, dom, err = chromium(tmp_path, url, "--enable-logging=stderr", "--v=0", "--dump-dom")
    assert rc == 0, f"chromium failed ({rc}):\n{err[-3000:]}"
    assert console_lines(err) == [], "the page wrote to the console:\n" + "\n".join(console_lines(err))
    attrs, text = selfcheck(dom)
    assert attrs.get("data-ok") == "1", f"self-check failed: {text} {attrs}"
    assert attrs["data-errors"] == "0" and attrs["data-mismatch"] == "0", attrs
    assert int(attrs["data-cards"]) == cards, (attrs, text)
    assert int(attrs["data-timelines"]) == cards, attrs
    assert int(attrs["data-points"]) == points, (attrs, text)
    assert dom.count("<article class=\"finding") == cards
    if shot:
        png = tmp_path / "report.png"
        rc, _, err = chromium(tmp_path, url, f"--screenshot={png}", "--window-size=1200,900",
                              "--hide-scrollbars")
        assert rc == 0 and png.exists(), f"no screenshot ({rc}):\n{err[-2000:]}"
        w, h, distinct = png_info(png)
        assert (w, h) == (1200, 900), (w, h)
        assert png.stat().st_size > 20_000, png.stat().st_size
        assert distinct > 20, f"a near-blank screenshot ({distinct} distinct byte values)"
    return dom


# --- synthetic traces ----------------------------------------------------------

def parent_trace(ncounts=37):
    """pid 4242: a double delete, two DLPack leaks from one stack, a NumPy leak,
    hostile argv and file names, ncounts COUNTS records."""
    recs = [header(pid=4242, ppid=1),
            process(["python3", HOSTILE_ARG], "/usr/bin/python3"),
            rec(REC_OPTIONS, cstr("log_path=capsan.trace")),
            thread(1, 4242, "MainThread"),
            module(0x7F0000000000, 0x7F0000000000, 0x7F0000100000, "/nonexistent/<lib>&.so", b"\xca\xfe"),
            code(1, HOSTILE_FILE, "<module>"), code(2, "/work/x.py", "consume & <free>", 10),
            frame(1, 0, pyframe(1, 20, entry=True)),
            frame(2, 1, pyframe(2, 12)),
            frame(3, 2, 0x7F0000001234),
            frame(4, 1, pyframe(1, 30, entry=True))]
    t = 1000
    for i in range(ncounts):
        recs.append(counts(t + i * 10_000_000, events=i, live_dlpack=i % 5,
                           live_numpy=i % 3, live_numpy_bytes=(i * 4096) % 50_000))
    recs += [event(EV_EXPORT, TENSOR, a=CAPSULE, b=DELETER, c=800, stack=1, t=2000),
             event(EV_CONSUME, TENSOR, a=CAPSULE, stack=2, t=3000),
             event(EV_DELETE, TENSOR, stack=3, t=4000),
             event(EV_DELETE, TENSOR, stack=3, t=5000)]
    for k in range(2):   # two consumed, never released, from one export stack
        obj = 0x66000000 + k * 64
        recs += [event(EV_EXPORT, obj, a=CAPSULE + 64 * (k + 1), b=DELETER, c=4096, stack=4, t=6000 + k),
                 event(EV_CONSUME, obj, a=CAPSULE + 64 * (k + 1), stack=2, t=7000 + k)]
    recs += [event(EV_NP_ALLOC, 0x9000, a=123, stack=4, t=8000),
             end(how=END_EXIT, t=ncounts * 10_000_000 + 5000, events=123456)]
    return b"".join(recs)


def child_trace(ncounts=5000):
    """pid 4243, child of 4242, killed (no END): a double delete and many COUNTS."""
    recs = [header(pid=4243, ppid=4242), process(["python3", "-c", "work()"], "/usr/bin/python3"),
            code(1, "/work/child.py", "work"), frame(1, 0, pyframe(1, 5, entry=True))]
    for i in range(ncounts):
        recs.append(counts(i * 1_000_000, events=i * 10, live_dlpack=(i // 100) % 7,
                           live_numpy_bytes=(i * 37) % 10_000))
    recs += [event(EV_EXPORT, TENSOR, a=CAPSULE, b=DELETER, c=64, stack=1, t=100),
             event(EV_CONSUME, TENSOR, a=CAPSULE, stack=1, t=150),
             event(EV_DELETE, TENSOR, stack=1, t=200),
             event(EV_DELETE, TENSOR, stack=1, t=300)]
    return b"".join(recs) + b"\0" * 4096


def counts_records(ncounts, parent):
    """What counts() wrote: (CLOCK_MONOTONIC time, events, dl, dl_bytes, np, np_bytes)"""
    if parent:
        return [(START_MONO + 1000 + i * 10_000_000, i, i % 5, 0, i % 3, (i * 4096) % 50_000)
                for i in range(ncounts)]
    return [(START_MONO + i * 1_000_000, i * 10, (i // 100) % 7, 0, 0, (i * 37) % 10_000)
            for i in range(ncounts)]


@pytest.fixture
def traces(tmp_path):
    a = tmp_path / "capsan.trace.4242"
    b = tmp_path / "capsan.trace.4243"
    a.write_bytes(parent_trace())
    b.write_bytes(child_trace())
    return a, b


# --- tests ---------------------------------------------------------------------

def test_html_page_in_chromium(tmp_path, traces):
    out = tmp_path / "report.html"
    # the child first on the command line: the report puts it under its parent
    r = report("--format", "html", "-o", str(out), str(traces[1]), str(traces[0]))
    assert r.returncode == 0, r.stderr
    assert r.stdout == ""
    html = out.read_text()
    # self-contained: nothing to fetch, and a policy that forbids fetching
    assert not re.search(r"https?://", html)
    assert not re.search(r"<(link|img|iframe)\b|\bsrc=|url\(", html)
    assert "Content-Security-Policy" in html and "default-src 'none'" in html
    expected_points = 37 + len(downsample(counts_records(5000, False))[0])
    # the parent's two identical leaks are one card, as in the text report
    dom = check_page(tmp_path, out, cards=4, points=expected_points)
    assert "2 objects made at the same stack, 8192 bytes in all" in dom

    # hostile strings are text, never markup
    assert dom.count("<script") == 2, "an argv or file name became a script element"
    assert "&lt;script&gt;alert('x')&lt;/script&gt;&amp;\"q\".py" in dom or \
        "&lt;script&gt;alert(&#39;x&#39;)&lt;/script&gt;&amp;&quot;q&quot;.py" in html
    assert "<b>bold</b>" not in dom and "&lt;b&gt;bold&lt;/b&gt;&amp;amp;.py" in dom
    assert "consume &amp; &lt;free&gt;" in dom
    # the processes: parent first, the child indented under it
    rows = re.findall(r'<tr[^>]*><td>(.*?)</td>', dom)
    assert len(rows) == 2 and ">4242<" in rows[0] and ">4243<" in rows[1] and "└─" in rows[1], rows
    assert "child of <a" in dom
    assert "killed (SIGKILL?) or still running" in dom and "killed or still running (no END record)" in dom
    # cards: kinds, one card per finding, identical leaks one card per stack
    kinds = re.findall(r'<article class="finding (?:error|warning)" id="f\d+" data-kind="([\w-]+)"', dom)
    assert sorted(kinds) == sorted(["dlpack-double-delete", "dlpack-leak", "numpy-leak",
                                    "dlpack-double-delete"]), kinds
    # the lifecycle timeline of the double delete: one dot per event, phrases as labels
    first = dom[dom.index('data-kind="dlpack-double-delete"'):]
    first = first[:first.index("</article>")]
    assert first.count("<circle") == 4
    for phrase in ("exported", "consumed", "deleted", "deleted again"):
        assert f">{phrase} (T1)" in first, phrase
    # collapsible merged stacks: the culprit event open, Python frames named
    assert first.count("<details") == 4 and first.count("<details class=\"event\" open") == 1
    assert "/work/x.py:12" in first and "(&lt;lib&gt;&amp;.so+0x1234)" in first
    # a leak card shows the exit marker on its timeline
    leak = dom[dom.index('data-kind="dlpack-leak"'):]
    assert "process exit: never released" in leak[:leak.index("</article>")]
    # the downsampled plot says so
    assert "downsampled from 5000 COUNTS records" in dom


def test_html_max_findings_and_no_counts(tmp_path, traces):
    """--max-findings caps the cards per process and says how many were left out;
    a trace without COUNTS records says why it has no plot."""
    data = parent_trace(ncounts=0)
    p = tmp_path / "nocounts"
    p.write_bytes(data)
    out = tmp_path / "capped.html"
    r = report("--format", "html", "--max-findings", "2", "-o", str(out), str(p), str(traces[1]))
    assert r.returncode == 0, r.stderr
    html = out.read_text()
    # 2 of the parent's 3 cards (its two identical leaks are one), the child's 1
    assert html.count('<article class="finding') == 3
    assert "Omitting 1 more finding(s)" in html
    assert "No COUNTS records in this trace" in html
    assert len(re.findall(r'<svg class="plot"', html)) == 1
    # the summary still counts every finding
    assert re.search(r'<td class="num">4</td>', html)
    check_page(tmp_path, out, cards=3, points=len(downsample(counts_records(5000, False))[0]),
               shot=False)


def test_html_counts_match_json(tmp_path, traces):
    """The plot's points are the JSON report's counts.points, downsampled per the model."""
    r = report("--format", "json", str(traces[0]), str(traces[1]))
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    procs = {p["pid"]: p for p in doc["processes"]}
    assert procs[4243]["parent"] == 4242 and "parent" not in procs[4242]
    for pid, n, parent in ((4242, 37, True), (4243, 5000, False)):
        c = procs[pid]["counts"]
        pts, stride = downsample(counts_records(n, parent))
        assert c["records"] == n and c["stride"] == stride
        start = 1_000_000_000
        assert [tuple(p) for p in c["points"]] == [(t - start if t >= start else t, *rest)
                                                   for t, *rest in pts]
    assert procs[4243]["counts"]["stride"] > 1 and len(procs[4243]["counts"]["points"]) <= 2000


def test_html_unreadable_and_corrupt(tmp_path, traces):
    bad = tmp_path / "notatrace"
    bad.write_bytes(b"hello")
    data = parent_trace()
    off = data.index(struct.pack("<HHI", 6, 0, 64), 64)
    cut = tmp_path / "corrupt"
    cut.write_bytes(data[:off] + struct.pack("<HHI", 6, 0, 61) + data[off + 8:])
    out = tmp_path / "r.html"
    r = report("--format", "html", "-o", str(out), str(bad), str(cut))
    assert r.returncode == 1
    html = out.read_text()
    assert "not a capsan trace" in html and f"corrupt record at offset {off:#x}" in html
    assert html.rstrip().endswith("</html>")


# --- a crash, from a real run -------------------------------------------------------

def test_html_of_a_crash(tmp_path):
    """A run that dies by abort() with eight tensors held (issue 34, item 6):
    the page shows the crashing thread's stack as the live report did, the
    plot reaches the crash with the eight tensors alive, identical stacks
    make one group, and no developer line is visible."""
    from conftest import SCENARIOS, marker_line, run_capsan
    script = SCENARIOS / "crash_held.py"
    res = run_capsan(script, tmp_path)
    assert res.returncode == 128 + signal.SIGABRT, res.describe()
    [trace] = res.traces
    text = report(str(trace)).stdout
    m = re.search(r"   the crashing thread \(\d+\):\n((?:    #\d+ .*\n)+)", text)
    assert m, text[:3000]
    frames = m.group(1)
    assert " in abort " in frames and f"crash_held.py:{marker_line(script, 'abort')} in <module>" \
        in frames, frames
    # one group per kind: the first call and the specialized later ones
    assert text.count("Unreleased when killed: ") == 1 and "in 8 object(s)" in text, text[-3000:]
    doc = json.loads(report("--format", "json", str(trace)).stdout)
    proc = doc["processes"][0]
    stack = proc["crash"]["stack"]
    assert stack[0]["function"] == "__pthread_kill_implementation" or "kill" in stack[0]["function"]
    assert stack[-1]["python"] and stack[-1]["line"] == marker_line(script, "abort"), stack
    last = proc["counts"]["points"][-1]
    assert last[2] == 8 and last[4] >= 8, proc["counts"]["points"][-3:]
    html = tmp_path / "crash.html"
    r = report("--format", "html", "-o", str(html), str(trace))
    assert r.returncode == 0, r.stderr
    points = len(proc["counts"]["points"])
    dom = check_page(tmp_path, html, cards=2, points=points)
    assert "the crashing thread" in dom and "abort" in dom, dom[-3000:]
    sc = re.search(r'<div id="selfcheck"([^>]*)>', dom).group(1)
    assert "hidden" in sc, sc
