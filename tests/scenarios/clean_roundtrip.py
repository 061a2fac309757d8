"""Correct numpy <-> torch DLPack exchanges: 0-d, empty, contiguous,
transposed and strided views, both directions, values checked.
Prints a deterministic transcript (compared byte for byte with and without capsan)."""
import numpy as np
import torch


def check(name, src, dst):
    src_np = src.numpy() if isinstance(src, torch.Tensor) else src
    dst_np = dst.numpy() if isinstance(dst, torch.Tensor) else np.asarray(dst)
    assert dst_np.shape == src_np.shape, (name, dst_np.shape, src_np.shape)
    assert np.array_equal(dst_np, src_np), name
    print(f"{name}: shape={tuple(dst_np.shape)} sum={dst_np.sum()!r}")


base = np.arange(24, dtype=np.float32).reshape(4, 6)
cases = {
    "zero_d": np.array(3.5, dtype=np.float64),
    "empty": np.zeros((0,), dtype=np.float32),
    "empty_2d": np.zeros((3, 0), dtype=np.int64),
    "contiguous": base,
    "transposed": base.T,
    "step_slice": base[::2, 1::3],
    "int_step_slice": np.arange(20, dtype=np.int32)[2:18:4],
}
for name, a in cases.items():
    t = torch.from_dlpack(a)  # numpy -> torch
    check("np->torch " + name, a, t)
    b = np.from_dlpack(t)  # torch -> numpy (back again)
    check("np->torch->np " + name, a, b)
    del t, b

tb = torch.arange(30, dtype=torch.float64).reshape(5, 6)
tcases = {
    "zero_d": torch.tensor(7, dtype=torch.int64),
    "empty": torch.zeros(0, 4),
    "contiguous": tb,
    "transposed": tb.t(),
    "step_slice": tb[1::2, ::3],
}
for name, t in tcases.items():
    a = np.from_dlpack(t)  # torch -> numpy
    check("torch->np " + name, t, a)
    # numpy marks imported arrays read-only and refuses to re-export them
    # (BufferError): go back through a numpy-owned copy
    t2 = torch.from_dlpack(a.copy())  # numpy -> torch
    check("torch->np->torch " + name, t, t2)
    del a, t2

# a capsule made explicitly and consumed once
cap = torch.utils.dlpack.to_dlpack(torch.ones(3))
t3 = torch.utils.dlpack.from_dlpack(cap)
check("to_dlpack/from_dlpack", torch.ones(3), t3)
del cap, t3
print("done")
