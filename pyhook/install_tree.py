"""`make install`'s Python half: put build/python's package and dist-info
where PYTHON looks for a prefix of PREFIX, with a RECORD naming the whole
installation (pip can uninstall it, and capsan/_lib.py finds the runtime
through it).

    PYTHON pyhook/install_tree.py --prefix PREFIX [--destdir DESTDIR] [--build build]
    PYTHON pyhook/install_tree.py --prefix PREFIX --print-site

The site directory is the purelib of PYTHON's default install scheme with
base = PREFIX (PREFIX/lib/pythonX.Y/site-packages for posix_prefix,
PREFIX/local/lib/pythonX.Y/dist-packages for Debian's posix_local), except
where PYTHON already searches its own purelib under PREFIX and the scheme's
is not searched: Debian's /usr/bin/python3 with PREFIX=/usr/local gets
/usr/local/lib/python3.X/dist-packages. PREFIX/bin/capsan and
PREFIX/lib/libcapsan.so must be installed (under DESTDIR) before.
"""
from __future__ import annotations

import argparse
import base64
import hashlib
import os
import shutil
import site
import sys
import sysconfig

DIST = "capsan-0.1.dist-info"


def site_dir(prefix: str) -> str:
    prefix = os.path.abspath(prefix)
    scheme = sysconfig.get_paths(vars={"base": prefix, "platbase": prefix})["purelib"]
    if scheme not in sys.path:
        own = sysconfig.get_paths()["purelib"]
        if own in sys.path and own in site.getsitepackages([prefix]):
            return own
    return scheme


def _record_line(path: str, rel: str) -> str:
    with open(path, "rb") as f:
        data = f.read()
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{rel},sha256={digest},{len(data)}"


def install(prefix: str, destdir: str, build: str) -> str:
    prefix = os.path.abspath(prefix)
    where = site_dir(prefix)
    stage = lambda p: os.path.join(destdir, p.lstrip("/")) if destdir else p  # noqa: E731
    dst = stage(where)
    src_pkg = os.path.join(build, "python", "capsan")
    src_dist = os.path.join(build, "python", DIST)
    os.makedirs(dst, exist_ok=True)
    # a reinstall replaces the previous copy whole (no stale modules)
    for name in os.listdir(dst):
        if name == "capsan" or (name.startswith("capsan-") and name.endswith(".dist-info")):
            shutil.rmtree(os.path.join(dst, name))
    records = []
    pkg = os.path.join(dst, "capsan")
    os.makedirs(pkg)
    for name in sorted(os.listdir(src_pkg)):
        if name.endswith(".py"):
            shutil.copy2(os.path.join(src_pkg, name), os.path.join(pkg, name))
            records.append(_record_line(os.path.join(pkg, name), f"capsan/{name}"))
    dist = os.path.join(dst, DIST)
    os.makedirs(dist)
    for name in ("METADATA", "entry_points.txt"):
        shutil.copy2(os.path.join(src_dist, name), os.path.join(dist, name))
    with open(os.path.join(dist, "INSTALLER"), "w") as f:
        f.write("make\n")
    for name in ("METADATA", "entry_points.txt", "INSTALLER"):
        records.append(_record_line(os.path.join(dist, name), f"{DIST}/{name}"))
    # the native files, as paths relative to the site directory (as a
    # wheel's data and scripts are recorded); DESTDIR appears nowhere
    for native in (os.path.join(prefix, "bin", "capsan"),
                   os.path.join(prefix, "lib", "libcapsan.so")):
        if not os.path.exists(stage(native)):
            sys.exit(f"capsan: {stage(native)} is not installed")
        records.append(_record_line(stage(native), os.path.relpath(native, where)))
    records.append(f"{DIST}/RECORD,,")
    with open(os.path.join(dist, "RECORD"), "w") as f:
        f.write("\n".join(records) + "\n")
    return dst


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prefix", required=True)
    ap.add_argument("--destdir", default="")
    ap.add_argument("--build", default="build")
    ap.add_argument("--print-site", action="store_true",
                    help="print the site directory for PREFIX and install nothing")
    a = ap.parse_args()
    if a.print_site:
        print(site_dir(a.prefix))
        return
    print(f"capsan: Python package in {install(a.prefix, a.destdir, a.build)}")


if __name__ == "__main__":
    main()
