"""A read-only image handed through a pipeline stage (imgstage) that
re-exports what it consumed. numpy 2 exports a read-only array with
DLPACK_FLAG_BITMASK_READ_ONLY in a versioned capsule; the stage's buggy
hand-offs drop the flag (or use a legacy capsule, which cannot carry it),
so the next stage's numpy.from_dlpack gets a writable array over read-only
memory (dlpack-read-only-dropped, at the hand-off). numpy 2 happens to make
a read-only array of the legacy hand-off; a consumer that takes a legacy
tensor as writable does not, and the stage cannot know which comes next.

argv[1]: "bug" (handoff), "legacy" (handoff_legacy), "good" (handoff_good),
"writable" (handoff of a writable array: nothing to drop), "numpy" (numpy
re-exports a read-only array it imported: it keeps the flag).
"""
import sys

import numpy as np

import imgstage as S


class Cap:
    """Hands a capsule to numpy.from_dlpack, which asks for __dlpack__."""

    def __init__(self, cap):
        self.cap = cap

    def __dlpack__(self, **kw):
        return self.cap

    def __dlpack_device__(self):
        return (1, 0)


how = sys.argv[1]
img = np.frombuffer(bytes(range(64)), dtype=np.uint8)  # read-only: bytes are immutable
if how == "writable":
    img = np.arange(64, dtype=np.uint8)
if how == "numpy":
    mid = np.from_dlpack(img)  # <-- import
    nxt = np.from_dlpack(mid)  # <-- numpy-reexport
else:
    cap = img.__dlpack__(max_version=(1, 0))  # <-- export
    if how == "bug" or how == "writable":
        out = S.handoff(cap)  # <-- handoff
    elif how == "legacy":
        out = S.handoff_legacy(cap)  # <-- handoff-legacy
    else:
        out = S.handoff_good(cap)  # <-- handoff-good
    nxt = np.from_dlpack(Cap(out))  # <-- next
print("writeable", nxt.flags.writeable, flush=True)
del nxt
