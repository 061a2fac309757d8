"""A frame grabber's binding (framegrab) hands out a pool of frames as one
array around driver memory. Keeping one frame "after the pool is recycled"
with framegrab.detach() makes a numpy view into the pool claim OWNDATA:
when the frame dies numpy free()s a pointer into the middle of the pool.

argv[1]:
  detach  the bug: numpy-foreign-free, and natively glibc aborts
  copy    the fix: copy the frame (clean)
"""
import sys

import framegrab

mode = sys.argv[1]


def grab_and_keep(detach):
    pool = framegrab.frames(4, 16, 16)  # <-- pool
    frame = pool[2]
    kept = framegrab.detach(frame) if detach else framegrab.copy_frame(frame)
    del frame
    total = int(kept.sum())
    del kept  # <-- free
    del pool
    return total


print("sum", grab_and_keep(mode == "detach"), flush=True)
print("pools freed", framegrab.pools(), flush=True)
print("survived", mode, flush=True)
