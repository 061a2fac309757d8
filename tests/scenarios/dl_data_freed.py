"""An image type lends its pixels through DLPack, but its exported tensor
does not keep the image alive (imgbuf.Image, keep=False). The consumer's
array outlives the image: when the image dies, its pixels are freed while
numpy still shows them (dlpack-data-freed). Natively nothing crashes; the
numbers are whatever the allocator put there next.

argv[1]: "bug", "fixed" (keep=True: the tensor holds the image),
"bug-header" (the bug, with the pixels after a frame header in the block
that is freed), or "bug-crowd" (the bug, while 3,000 thumbnails consumed
after it stay alive: many consumed tensors, whose data starts crowd the
free() filter's slots)."""
import sys

import numpy as np

import imgbuf

keep = sys.argv[1] == "fixed"
img = imgbuf.Image(4096, keep=keep, header=sys.argv[1] == "bug-header")
arr = np.from_dlpack(img)  # <-- consume
thumbs = []
if sys.argv[1] == "bug-crowd":
    thumbs = [np.from_dlpack(imgbuf.Image(64, keep=True)) for _ in range(3000)]
del img  # <-- image-dies
junk = [bytes(16384) for _ in range(4)]  # the allocator reuses what it got back
print("first", float(arr[1]), flush=True)
del arr
print("done", flush=True)
