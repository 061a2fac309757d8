"""The upstream-suite cache (tests/upstream_sources.py) takes a cached folder
only as what it claims: its SOURCE names the pinned commit and each pinned
blob matches. A stand-in file put under a release's name (by hand, or the
file from another commit) is obtained again, never run as that release's
suite by `make check-upstream`."""
import upstream_sources as us


def _seed(up, dest, content=None, source=None):
    for p in up.paths:
        (dest / p).parent.mkdir(parents=True, exist_ok=True)
        (dest / p).write_bytes(content if content is not None else b"# stand-in\n")
    (dest / "SOURCE").write_text(source if source is not None else us._source_line(up))


def test_cache_refuses_a_stand_in_for_pinned_blobs(tmp_path):
    # JAX's files are pinned by blob id: right SOURCE, wrong bytes
    _seed(us.JAX, tmp_path)
    assert not us._cached(us.JAX, tmp_path)


def test_cache_refuses_another_commit(tmp_path):
    # torch's file has no pinned blob (its tag's file could not be read
    # here): the SOURCE line is what names the commit
    _seed(us.TORCH, tmp_path, source="pytorch/pytorch main 1628e2c3564bbbee48a13ec1cef74d370bcdb368\n")
    assert not us._cached(us.TORCH, tmp_path)
    _seed(us.TORCH, tmp_path)
    assert us._cached(us.TORCH, tmp_path)


def test_cache_takes_the_pinned_file(tmp_path):
    # what obtain() wrote for a pinned release is taken as it is
    up = us.Upstream("demo", "demo", "1.0", "owner/demo", "v1.0", "0" * 40, ("t/a.py",),
                     blobs={"t/a.py": us.blob_id(b"print(1)\n")})
    _seed(up, tmp_path, content=b"print(1)\n")
    assert us._cached(up, tmp_path)
    (tmp_path / "t" / "a.py").write_bytes(b"print(2)\n")
    assert not us._cached(up, tmp_path)
    (tmp_path / "SOURCE").unlink()
    assert not us._cached(up, tmp_path)
