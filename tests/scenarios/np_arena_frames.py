"""A frame pipeline allocates its arrays from a NEP 49 arena (np_arena: the
pieces of one backing block) and lends a frame through DLPack. Closing the
arena frees the whole block at once: if the consumer still holds the frame's
tensor, it reads freed memory (dlpack-data-freed), though the frame's data
starts 1 KiB into the block, not at it. The arena hands its start out again
once every piece is back: that address is then two live blocks, the backing
one and a piece, which is no numpy-double-free or numpy-stale-handler.

argv[1]: "bug" (close the arena while the consumer holds the tensor) or
"fixed" (the consumer releases it first).
argv[2]: the consumer: "c" (dlconsumer.consume_hold, a C extension that
holds the DLManagedTensor) or "torch" (torch.from_dlpack).
argv[3]: what reuses the freed backing block: "bytes" (the default) or
"numpy" (arrays through the default handler: the backing block's address
handed out again while the arena's piece there still lives)."""
import sys

import numpy as np

import np_arena

bug = sys.argv[1] == "bug"
who = sys.argv[2] if len(sys.argv) > 2 else "c"
reuse = sys.argv[3] if len(sys.argv) > 3 else "bytes"
if who == "torch":
    import torch
else:
    import dlconsumer

prev = np_arena.open(1 << 16)  # <-- open
scratch = [np.ones(64) for _ in range(4)]  # pieces from the arena's start
del scratch  # every piece back: the arena starts over
hdr = np.zeros(128)  # the arena's start, handed out again
frame = np.arange(1024, dtype=np.float64)  # 1 KiB into the block
if who == "torch":
    t = torch.from_dlpack(frame)  # <-- consume-torch
    total = float(t.sum())
else:
    total = dlconsumer.consume_hold(frame.__dlpack__())  # <-- consume
del frame
if not bug:
    if who == "torch":
        del t
    else:
        dlconsumer.release_holds()
np_arena.close(prev)  # <-- close
# the allocator reuses what it got back
junk = [np.ones(1 << 13) if reuse == "numpy" else bytes(1 << 16) for _ in range(2)]
if bug:
    if who == "torch":
        print("after", float(t[1]), flush=True)
        del t
    else:
        dlconsumer.release_holds()
del hdr
print("done", total, np_arena.stats(), flush=True)
