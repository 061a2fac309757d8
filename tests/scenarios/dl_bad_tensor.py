"""Malformed tensors (dlpack-bad-tensor). argv[1] is one of dlproducer.bad_kinds(),
or "version_major" / "flags" for a versioned capsule with major 2 / unknown flag bits.
The capsules have correct destructors: the only bug is their content."""
import sys

import dlproducer as P

kind = sys.argv[1]
if kind == "version_major":
    cap = P.versioned(4, major=2)  # <-- export-major
elif kind == "flags":
    cap = P.versioned(4, flags=1 << 40)  # <-- export-flags
else:
    cap = P.bad(kind)  # <-- export
del cap
print("deleted", P.deleted_count(), flush=True)
