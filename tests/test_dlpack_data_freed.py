"""dlpack-data-freed (issue 11): a producer frees the memory a consumed
tensor's data points into while the consumer still holds the undeleted
DLManagedTensor (tests/fixtures/imgbuf.c: an image whose export does not
keep it alive). The free is reported with the tensor's export and consume
stacks; frees in the tensor's own deleter, and the fixed producer, are
clean."""
import pytest

from conftest import (DEFAULT_EXITCODE, SCENARIOS, assert_finding_at, findings, kinds,
                      run_capsan, summarize)

S = SCENARIOS / "dl_data_freed.py"


@pytest.mark.parametrize("layout", ["bug", "bug-header", "bug-crowd"])
def test_image_freed_under_the_consumer(tmp_path, anypy, layout):
    """The free of the pixels' block: the pixels alone, or a frame header
    and then the pixels (the data starts inside the freed block), or the
    pixels alone while 3,000 other consumed tensors are alive (each free()
    is judged by the consumed-data index, not by the last start its filter
    slot saw)."""
    res = run_capsan(S, tmp_path, interpreter=anypy, args=[layout])
    assert res.returncode == DEFAULT_EXITCODE and "done" in res.stdout, res.describe()
    f = assert_finding_at(res, "dlpack-data-freed", S, "image-dies", event="free")
    assert f["severity"] == "error"
    assert_finding_at(res, "dlpack-data-freed", S, "consume", event="consume")
    assert_finding_at(res, "dlpack-data-freed", S, "consume", event="export")
    assert "its consumer still holds the tensor" in f["message"]
    assert kinds(res.report) == {"dlpack-data-freed"}, summarize(res.report)
    assert len(findings(res.report)) == 1, summarize(res.report)


def test_image_kept_alive_by_its_tensor_is_clean(tmp_path, anypy):
    res = run_capsan(S, tmp_path, interpreter=anypy, args=["fixed"])
    assert res.returncode == 0 and "first 1.0" in res.stdout, res.describe()
    assert findings(res.report) == [], summarize(res.report)
