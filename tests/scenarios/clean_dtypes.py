"""Every dtype both directions; prints one line per (dtype, direction):
   OK dtype dir   or   REFUSED dtype dir ExceptionType
A refused import must leave the capsule unconsumed for its producer to release.

Two of torch 1.13's refusals leak for real, and capsan must say so (verified
natively: 2000 refusals of a 200 kB uint16 array grow RSS by ~390 MB):
torch.from_numpy keeps a reference to an array whose dtype it rejects
(TypeError), and torch.to_dlpack of a bool tensor allocates its manager
struct, then throws on the dtype and never frees it (the tensor, and the
numpy array under it, stay alive)."""
import numpy as np
import torch

NP_DTYPES = ["int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64",
             "float16", "float32", "float64", "complex64", "complex128", "bool"]

for d in NP_DTYPES:
    a = (np.arange(6) % 2 == 1) if d == "bool" else np.arange(6).astype(d)
    try:
        t = torch.from_dlpack(a)
        assert np.array_equal(t.numpy(), a), d
        print("OK", d, "np->torch")
        del t
    except Exception as e:  # noqa: BLE001 - the refusal is what we record
        print("REFUSED", d, "np->torch", type(e).__name__)
    try:
        src = torch.from_numpy(a.copy())  # <-- from_numpy
    except TypeError:
        print("REFUSED", d, "torch->np", "NoTorchDtype")
        continue
    try:
        b = np.from_dlpack(src)
        assert np.array_equal(b, a), d
        print("OK", d, "torch->np")
        del b
    except Exception as e:  # noqa: BLE001
        print("REFUSED", d, "torch->np", type(e).__name__)

# the last dtype's arrays: the globals let go of them, so that only torch's
# own leak keeps its array (a global still naming it at exit is "still
# reachable", as LeakSanitizer counts it, and no leak)
del a, src

# torch-only dtype
try:
    np.from_dlpack(torch.zeros(3, dtype=torch.bfloat16))
    print("OK bfloat16 torch->np")
except Exception as e:  # noqa: BLE001
    print("REFUSED", "bfloat16", "torch->np", type(e).__name__)
print("done")
