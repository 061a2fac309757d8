"""A finding's advice fits what the code did (issue 37 path 10): duckdb
scanning a consumed stream capsule again checks release != NULL and raises,
so arrow-reconsume's advice names the second hand-over and does not tell
the consumer to check what it checked."""
import pytest

from conftest import SCENARIOS, assert_finding_at, findings, kinds, run_capsan, summarize



def test_duckdb_rescan_blames_the_second_hand_over(tmp_path, apy):
    script = SCENARIOS / "ar_duckdb_rescan.py"
    res = run_capsan(script, tmp_path, interpreter=apy, timeout=300)
    assert "[(6,)]" in res.stdout and "raised:" in res.stdout, res.describe()
    assert kinds(res.report) == {"arrow-reconsume"}, summarize(res.report)
    assert len(findings(res.report)) == 1, summarize(res.report)
    f = assert_finding_at(res, "arrow-reconsume", script, "again", innermost=False)
    assert_finding_at(res, "arrow-reconsume", script, "export", event="export")
    msg = f["message"]
    assert "handed to a consumer again" in msg and "consumers must check" not in msg, msg
