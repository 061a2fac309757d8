"""`python -m capsan ARGS`: the capsan command (run, report, help-options,
--version) that lies beside the runtime this package found (LIB/../bin,
as in the build tree, a pip install and make install), for those who run
their tools as memray's users do."""
import os
import sys

from . import _lib


def main() -> int:
    if _lib.load_error is not None:
        print(_lib.load_error, file=sys.stderr)
        return 2
    cli = os.path.join(os.path.dirname(os.path.dirname(_lib.path)), "bin", "capsan")
    if not os.access(cli, os.X_OK):
        print(f"capsan: no capsan command beside the runtime {_lib.path} (looked for {cli})",
              file=sys.stderr)
        return 2
    sys.stdout.flush()
    os.execv(cli, [cli, *sys.argv[1:]])
    return 2  # not reached


if __name__ == "__main__":
    sys.exit(main())
