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


# ---- issue 37 path 3: the tensor's data inside a larger block ----
A = SCENARIOS / "np_arena_frames.py"
# torch is in Debian's 3.11 (1.13) and the cp311 venv (2.13)
TORCH_TAGS = {"static", "shared", "cp311"}


def _arena_args(request, consumer):
    if consumer == "torch" and request.node.callspec.params["anypy"] not in TORCH_TAGS:
        pytest.skip("no torch in this interpreter's stack")
    return [consumer]


@pytest.mark.parametrize("consumer", ["c", "torch"])
def test_arena_freed_whole_under_the_consumer(tmp_path, anypy, consumer, request):
    """A NEP 49 arena frees its one backing block while a frame carved
    1 KiB into it is still held by a DLPack consumer: the free of a block
    that starts far before the tensor's data is found (the consumed-data
    index's ordered walk), at the arena's close, with the consume line.
    The arena's first piece shares the backing array's address: no
    numpy-double-free or numpy-stale-handler for it."""
    res = run_capsan(A, tmp_path, interpreter=anypy, args=["bug"] + _arena_args(request, consumer))
    assert res.returncode == DEFAULT_EXITCODE and "done" in res.stdout, res.describe()
    f = assert_finding_at(res, "dlpack-data-freed", A, "close", event="free")
    assert f["severity"] == "error"
    # torch's from_dlpack is Python: the script's line is the caller's frame
    consume = "consume-torch" if consumer == "torch" else "consume"
    assert_finding_at(res, "dlpack-data-freed", A, consume, event="consume",
                      innermost=consumer == "c")
    assert kinds(res.report) == {"dlpack-data-freed"}, summarize(res.report)
    assert len(findings(res.report)) == 1, summarize(res.report)


@pytest.mark.parametrize("mode", ["bug", "fixed"])
def test_arena_address_reused_by_default_handler(tmp_path, anypy, mode):
    """Issue 44 item 3's other way round: after the arena closes, numpy's
    default handler hands out the freed backing block's address again
    while the arena's piece there still lives (two handlers' blocks at one
    address, each freed through its own): only the bug's
    dlpack-data-freed, and nothing for the fixed program."""
    res = run_capsan(A, tmp_path, interpreter=anypy, args=[mode, "c", "numpy"])
    assert res.returncode == (DEFAULT_EXITCODE if mode == "bug" else 0), res.describe()
    assert "done" in res.stdout, res.describe()
    if mode == "bug":
        assert_finding_at(res, "dlpack-data-freed", A, "close", event="free")
        assert kinds(res.report) == {"dlpack-data-freed"}, summarize(res.report)
        assert len(findings(res.report)) == 1, summarize(res.report)
    else:
        assert findings(res.report) == [], summarize(res.report)


@pytest.mark.parametrize("consumer", ["c", "torch"])
def test_arena_kept_until_released_is_clean(tmp_path, anypy, consumer, request):
    """The consumer lets go before the arena closes: nothing, though the
    arena hands its start out again while the backing array lives (two
    live NumPy blocks at one address, each freed through its own handler)."""
    res = run_capsan(A, tmp_path, interpreter=anypy,
                     args=["fixed"] + _arena_args(request, consumer))
    assert res.returncode == 0 and "done" in res.stdout, res.describe()
    assert findings(res.report) == [], summarize(res.report)
