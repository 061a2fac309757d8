"""NumPy double frees through OWNDATA aliases (issue 11): an extension
wraps an existing array's data in a second array that claims to own it.
The first array frees the block through its memory handler, the alias
frees it again with numpy's handler-less free(): numpy-double-free with
allocated at / freed at / freed again at, each at its Python line."""
from conftest import (DEFAULT_EXITCODE, SCENARIOS, assert_finding_at, findings, kinds,
                      run_capsan, summarize)

S = SCENARIOS / "np_alias_owner.py"


def test_owndata_alias_double_free(tmp_path, anypy):
    res = run_capsan(S, tmp_path, interpreter=anypy)
    assert "sum 130816.0" in res.stdout, res.describe()
    # natively glibc may abort at the second free; capsan reports before it
    assert "ERROR: capsan: numpy-double-free" in res.stderr, res.describe()
    if "survived" in res.stdout:
        assert res.returncode == DEFAULT_EXITCODE, res.describe()
    f = assert_finding_at(res, "numpy-double-free", S, "alloc", event="alloc", innermost=False)
    assert_finding_at(res, "numpy-double-free", S, "free", event="free")
    assert_finding_at(res, "numpy-double-free", S, "free-again", innermost=False)
    # the line that made the alias: the array made around the block
    assert_finding_at(res, "numpy-double-free", S, "wrap", event="wrap", innermost=False)
    phrases = [e.get("phrase") for e in f["events"]]
    assert "array made around this memory at" in phrases, phrases
    assert phrases[-1] == "freed again with libc free() by numpy at", phrases
    assert kinds(res.report) == {"numpy-double-free"}, summarize(res.report)
    assert len(findings(res.report)) == 1, summarize(res.report)
