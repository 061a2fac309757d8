"""An FFI call layer (tests/fixtures/xffi.c) that converts torch tensors
through torch's exchange table and calls tvm-ffi functions with them
(issue 37 path 6).

    python xffi_calls.py MODE

lost: a call fails with its error raised through the FFI error API, and
the binding's bookkeeping overwrites its return code: the Python call
returns None. clean: the same calls through the binding that fetches the
error, which Python sees as a ValueError. Prints "ok" at the end."""
import sys

import tvm_ffi  # noqa: F401  (libtvm_ffi.so, RTLD_GLOBAL, before xffi)
import torch

import xffi

mode = sys.argv[1]
t = torch.arange(8, dtype=torch.float32)

if mode == "lost":
    assert xffi.call("reject", t) is None  # <-- lost
    assert xffi.call("sum", t) == 28.0  # the next FFI call
elif mode == "clean":
    for _ in range(3):
        assert xffi.call("sum", t) == 28.0
        assert xffi.call_good("sum", t) == 28.0
        try:
            xffi.call_good("reject", t)
        except ValueError:
            pass
        else:
            raise SystemExit("call_good did not raise")
else:
    raise SystemExit(f"unknown mode {mode}")
print("ok")
