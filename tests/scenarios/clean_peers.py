"""numpy 2, torch 2.x and JAX as real DLPack peers: every direction through
from_dlpack (np<->torch negotiate versioned capsules; JAX exports and imports
legacy ones), on one thread and on several at once, round trips that keep
their intermediate results and round trips that drop them. All of it is
correct traffic: capsan must report nothing.

JAX imports an unaligned host buffer by copying it: it releases the producer's
tensor right away, then renames the capsule (and clears its destructor).
Aligned buffers are shared instead, and released when the JAX array dies.
Both paths are taken. Run with JAX_PLATFORMS=cpu.
"""
import os
import sys
import threading
import time

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402

ROUNDS = int(sys.argv[1]) if len(sys.argv) > 1 else 50
THREADS = 4

print("stack numpy", np.__version__, "torch", torch.__version__, "jax", jax.__version__,
      flush=True)

N = 8
EXPECT = float(sum(range(N)))


def make(kind):
    if kind == "np":
        return np.arange(N, dtype=np.float32)
    if kind == "torch":
        return torch.arange(N, dtype=torch.float32)
    return jnp.arange(N, dtype=jnp.float32)


def aligned_np(align=64):
    """0..N-1 as float32 at an address that is a multiple of align (JAX
    shares such a buffer instead of copying it)."""
    raw = np.empty(N + align // 4, dtype=np.float32)
    skip = (-raw.ctypes.data % align) // 4
    a = raw[skip:skip + N]
    a[:] = np.arange(N, dtype=np.float32)
    assert a.ctypes.data % align == 0
    return a


IMPORT = {"np": np.from_dlpack, "torch": torch.from_dlpack, "jax": jnp.from_dlpack}
DIRECTIONS = [("np", "torch"), ("torch", "np"), ("np", "jax"), ("jax", "np"),
              ("torch", "jax"), ("jax", "torch")]


def total(x):
    return float(np.asarray(x).sum()) if not isinstance(x, torch.Tensor) else float(x.sum())


def exchange(src, dst, x=None):
    y = IMPORT[dst](make(src) if x is None else x)
    assert total(y) == EXPECT, (src, dst, total(y))
    return y


# one of each direction, kept alive together across a pause: the trace's
# counts record then shows them live (capsan saw DLPack traffic)
held = [exchange(s, d) for s, d in DIRECTIONS]
shared_src, copied_src = aligned_np(), aligned_np()[1:]
held.append(exchange("np", "jax", shared_src))  # shared, not copied
held.append(jnp.from_dlpack(copied_src))  # unaligned: copied, released at once
print("jax shared", held[-2].unsafe_buffer_pointer() == shared_src.ctypes.data,
      "copied", held[-1].unsafe_buffer_pointer() != copied_src.ctypes.data, flush=True)
time.sleep(0.03)
held.append(exchange("np", "torch"))
print("directions ok", len(held), flush=True)

# round trips through all three, keeping every intermediate, then dropping
keep = []
for _ in range(ROUNDS):
    a = make("np")
    t = torch.from_dlpack(a)
    j = jnp.from_dlpack(t)
    b = np.from_dlpack(j)
    t2 = torch.from_dlpack(b)
    j2 = jnp.from_dlpack(t2)
    a2 = np.from_dlpack(t2)
    assert total(a2) == total(j2) == EXPECT
    keep.append((a, t, j, b, t2, j2, a2))
keep.clear()

# and dropping each result at once
for _ in range(ROUNDS):
    for s, d in DIRECTIONS:
        exchange(s, d)
    total(np.from_dlpack(jnp.from_dlpack(torch.from_dlpack(make("np")))))
print("round trips ok", 2 * ROUNDS, flush=True)

# every direction from several threads at once
errors = []
done = []


def worker(k):
    try:
        mine = []
        for i in range(ROUNDS):
            s, d = DIRECTIONS[(i + k) % len(DIRECTIONS)]
            y = exchange(s, d)
            if i % 3 == 0:
                mine.append(y)  # some kept until the thread ends
        done.append(len(mine))
    except Exception as e:  # noqa: BLE001
        errors.append(repr(e))


ts = [threading.Thread(target=worker, args=(k,)) for k in range(THREADS)]
for th in ts:
    th.start()
for th in ts:
    th.join()
assert not errors, errors
print("threads ok", len(done), flush=True)

del held
print("done", flush=True)
