"""Upstream DLPack test files, at the exact release of the installed package,
for test_upstream_suites.py (`make check-upstream`). Nothing upstream is kept
in this repository: each file is obtained at run time into a cache,
~/.cache/capsan/upstream/NAME-VERSION/ (CAPSAN_UPSTREAM_CACHE overrides),
from the first source that has it:

- a pinned sdist from the package registry, with `pip download` (its sha256
  pinned here): tvm-ffi's sdist ships its tests/;
- a git directory holding the release's commit (`git show COMMIT:PATH`,
  content-addressed, so exact): CAPSAN_UPSTREAM_GIT, a colon-separated list
  of git directories or of folders with OWNER+NAME/repo in them (what the
  search tool's `fetch` makes), then /work/.mirror;
- the file at that commit from the project's public source host.

A file whose git blob id is pinned is checked against it whatever its source.
When no source has it, the test fails and says what it tried.
"""
from __future__ import annotations

import hashlib
import os
import subprocess
import tarfile
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

CACHE = Path(os.environ.get("CAPSAN_UPSTREAM_CACHE")
             or Path.home() / ".cache" / "capsan" / "upstream")
MIRRORS = "/work/.mirror"


@dataclass(frozen=True)
class Upstream:
    name: str           # the cache's folder prefix
    dist: str           # the installed distribution it belongs to
    version: str        # its exact installed version (checked)
    repo: str           # OWNER/NAME of the public source
    tag: str            # the release tag (named in messages)
    commit: str         # the tag's commit: the whole id, or the prefix the wheel records
    paths: tuple        # the test files, repo-relative
    blobs: dict = field(default_factory=dict)   # path -> git blob id, where known
    sdist: tuple = ()   # (file name, sha256) of a registry sdist that ships the paths


TORCH = Upstream(
    "torch", "torch", "2.13.0+cpu", "pytorch/pytorch", "v2.13.0",
    # torch.version.git_version of the cp311 venv's wheel
    "cf30153c4c131c8164ee7798e5022d810682e2cb", ("test/test_dlpack.py",))
JAX = Upstream(
    "jax", "jax", "0.10.2", "jax-ml/jax", "jax-v0.10.2",
    "990e6a0b84138346e6a38785412f36356e0e5dc3",
    ("tests/array_interoperability_test.py", "tests/pytorch_interoperability_test.py"),
    blobs={"tests/array_interoperability_test.py": "d033a490f5473c93bba609143c4aa2717ed249c0",
           "tests/pytorch_interoperability_test.py": "a9465e7323021a0093c70b6e43d50bdfb30eb014"})
TVM_FFI = Upstream(
    "tvm-ffi", "apache-tvm-ffi", "0.1.15.post2", "apache/tvm-ffi", "v0.1.15-post2",
    # tvm_ffi.__commit_id__ of the wheel (a describe id: "g" + 9 hex digits)
    "e9fdc58fa",
    ("tests/python/test_dlpack_exchange_api.py", "tests/python/test_container_dlpack_conversion.py",
     "tests/python/test_optional_torch_c_dlpack.py", "tests/python/test_tensor.py"),
    sdist=("apache_tvm_ffi-0.1.15.post2.tar.gz",
           "909be9ef5af07726aa9afd38a3111abc4d86cfd5927ebedfa9166232ce7d287b"))

NANOARROW = Upstream(
    "nanoarrow", "nanoarrow", "0.9.0", "apache/arrow-nanoarrow", "apache-arrow-nanoarrow-0.9.0",
    # NOT the 0.9.0 tag's commit: the newest commit of the stored snapshot
    # (/work/.mirror, after 0.9.0.dev; python/tests last changed in f883fbb),
    # which lacks the tag; its sdist ships no tests without a meson build
    "c0eb931d", ("python/tests",))
ARRO3 = Upstream(
    "arro3", "arro3-core", "0.9.1", "kylebarron/arro3", "py-v0.9.1",
    # NOT the 0.9.1 release's commit: the newest of the stored snapshot
    # ("Prepare 0.8.1"), which lacks the tag
    "7cfe579", ("tests/core",))
DUCKDB = Upstream(
    "duckdb", "duckdb", "2.0.1", "duckdb/duckdb-python", "v2.0.1",
    # NOT the 2.0.1 release's commit: the newest of the stored snapshot
    # (after v1.5.5), which lacks the tag
    "6239d16", ("tests/conftest.py", "tests/fast/arrow/test_arrow_pycapsule.py"))
POLARS = Upstream(
    "polars", "polars", "2.1.0", "pola-rs/polars", "py-2.1.0",
    # NOT the 2.1.0 release's commit: the newest of the stored snapshot
    # (after py-1.39.3), which lacks the tag
    "4db92c12c0",
    ("py-polars/tests/__init__.py", "py-polars/tests/unit/__init__.py",
     "py-polars/tests/unit/conftest.py", "py-polars/tests/unit/utils",
     "py-polars/tests/unit/interop/__init__.py", "py-polars/tests/unit/interop/test_interop.py",
     "py-polars/tests/unit/interop/test_arrow_stream_error.py"))


class Unavailable(Exception):
    pass


def blob_id(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def _git(gitdir, *args) -> subprocess.CompletedProcess:
    return subprocess.run(["git", f"--git-dir={gitdir}", *args], capture_output=True, timeout=120)


def _git_dirs(up: Upstream):
    owner, name = up.repo.split("/")
    for entry in [*filter(None, os.environ.get("CAPSAN_UPSTREAM_GIT", "").split(":")), MIRRORS]:
        for d in (Path(entry), Path(entry) / ".git", Path(entry) / f"{owner}+{name}" / "repo"):
            if (d / "HEAD").is_file():
                yield d


def _from_git(up: Upstream, tried: list) -> dict | None:
    for d in _git_dirs(up):
        cp = _git(d, "rev-parse", "--verify", "-q", f"{up.commit}^{{commit}}")
        full = cp.stdout.decode().strip()
        if cp.returncode != 0:
            tag = _git(d, "rev-parse", "--verify", "-q", f"{up.tag}^{{commit}}")
            seen = tag.stdout.decode().strip() or "no such tag"
            tried.append(f"git {d}: no commit {up.commit} ({up.tag}: {seen})")
            continue
        out = {}
        # a folder among the paths stands for every file under it
        names = []
        for p in up.paths:
            ls = _git(d, "ls-tree", "-r", "--name-only", full, "--", p).stdout.decode().split()
            names += ls or [p]
        for p in names:
            show = _git(d, "show", f"{full}:{p}")
            if show.returncode != 0:
                tried.append(f"git {d}: {full} has no {p}")
                break
            out[p] = show.stdout
        else:
            return out
    if not list(_git_dirs(up)):
        tried.append(f"git: no clone of {up.repo} in CAPSAN_UPSTREAM_GIT or {MIRRORS}")
    return None


def _from_sdist(up: Upstream, tried: list, pip_python) -> dict | None:
    fname, sha = up.sdist
    dl = CACHE / "sdists"
    dl.mkdir(parents=True, exist_ok=True)
    path = dl / fname
    if not path.exists():
        cp = subprocess.run([str(pip_python), "-m", "pip", "download", "-q", "--no-deps",
                             "--disable-pip-version-check", "--no-binary", ":all:",
                             f"{up.dist}=={up.version}", "-d", str(dl)],
                            capture_output=True, text=True, timeout=600)
        if cp.returncode != 0 or not path.exists():
            tried.append(f"pip download {up.dist}=={up.version} (sdist): {cp.stderr.strip()[-300:]}")
            return None
    if hashlib.sha256(path.read_bytes()).hexdigest() != sha:
        tried.append(f"{path}: sha256 is not the pinned {sha}")
        return None
    top = fname[:-len(".tar.gz")]
    out = {}
    with tarfile.open(path) as tf:
        for p in up.paths:
            try:
                out[p] = tf.extractfile(f"{top}/{p}").read()
            except KeyError:
                tried.append(f"{fname} has no {p}")
                return None
    return out


def _from_host(up: Upstream, tried: list) -> dict | None:
    ref = up.commit if len(up.commit) == 40 else up.tag
    out = {}
    for p in up.paths:
        url = f"https://raw.githubusercontent.com/{up.repo}/{ref}/{p}"
        try:
            with urllib.request.urlopen(url, timeout=20) as r:
                out[p] = r.read()
        except OSError as e:
            tried.append(f"{url}: {e}")
            return None
    return out


def _source_line(up: Upstream) -> str:
    return f"{up.repo} {up.tag} {up.commit}\n"


def _cached(up: Upstream, dest: Path) -> bool:
    """A cached folder is used only as what it says it is: its SOURCE names
    the pinned commit, and each pinned blob still matches (a file put there
    by hand, or from another commit, is obtained again)."""
    try:
        if (dest / "SOURCE").read_text() != _source_line(up):
            return False
        for p in up.paths:
            if (dest / p).is_dir():
                continue  # a folder: what SOURCE's commit had under it
            data = (dest / p).read_bytes()
            if up.blobs.get(p) and blob_id(data) != up.blobs[p]:
                return False
    except OSError:
        return False
    return True


def obtain(up: Upstream, pip_python) -> Path:
    """The folder holding up.paths (under their repo-relative names) at the
    pinned release; raises Unavailable saying what was tried."""
    dest = CACHE / f"{up.name}-{up.version}"
    if _cached(up, dest):
        return dest
    tried = []
    files = None
    if up.sdist:
        files = _from_sdist(up, tried, pip_python)
    files = files or _from_git(up, tried) or _from_host(up, tried)
    if files is None:
        raise Unavailable(f"{up.repo}'s {', '.join(up.paths)} at {up.tag} ({up.commit}) could not "
                          "be obtained:\n  " + "\n  ".join(tried) + "\nclone the repository (one "
                          f"holding that commit: git clone --depth 1 --branch {up.tag} ...) and "
                          "point CAPSAN_UPSTREAM_GIT at it")
    for p, data in files.items():
        want = up.blobs.get(p)
        if want and blob_id(data) != want:
            raise Unavailable(f"{up.repo}:{p} has blob {blob_id(data)}, not the pinned {want}")
    tmp = dest.with_name(dest.name + f".tmp{os.getpid()}")
    for p, data in files.items():
        (tmp / p).parent.mkdir(parents=True, exist_ok=True)
        (tmp / p).write_bytes(data)
    (tmp / "SOURCE").write_text(_source_line(up))
    if dest.exists():
        subprocess.run(["rm", "-rf", str(dest)], check=True)
    tmp.rename(dest)
    return dest
