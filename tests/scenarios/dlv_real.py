"""Versioned DLPack (>= 1.0) from real producers, numpy 2 and torch 2.x,
taken by the fixture consumer's versioned paths, each committing its bug.

argv[1]: the bug
  leak          consumed (renamed used_dltensor_versioned), never deleted
  double        deleted twice                          (protect=1 survives it)
  not_renamed   deleted, the capsule left "dltensor_versioned": the
                producer's own destructor deletes again (protect=1 skips it)
  reconsume     the consumed capsule read again through its used_* name
  reshape       the consumer writes into the producer's shape array (R20)
  checked       consumed and released correctly, then the capsule dropped:
                the producer's destructor must leave a used_* capsule alone
argv[2]: the producer, "numpy" or "torch" (both imported either way: the
         current stack has torch installed beside numpy)
"""
import sys

import numpy as np
import torch

import dlconsumer as C

bug, producer = sys.argv[1], sys.argv[2]
print("stack numpy", np.__version__, "torch", torch.__version__, flush=True)
if producer == "numpy":
    src = np.arange(8, dtype=np.float32)
else:
    src = torch.arange(8, dtype=torch.float32)


def export():
    cap = src.__dlpack__(max_version=(1, 0))  # <-- export
    assert "dltensor_versioned" in repr(cap), repr(cap)
    return cap


if bug == "leak":
    cap = export()
    print("sum", C.consume_versioned_leak(cap), flush=True)  # <-- consume-leak
elif bug == "double":
    cap = export()
    print("sum", C.double_delete_versioned(cap), flush=True)  # <-- double-delete
elif bug == "not_renamed":
    cap = export()
    print("sum", C.delete_no_rename_versioned(cap), flush=True)  # <-- delete-no-rename
    del cap  # <-- destroy
elif bug == "reconsume":
    cap = export()
    print("sums", *C.consume_twice_versioned(cap), flush=True)  # <-- reconsume
elif bug == "reshape":
    cap = export()
    print("sum", C.reshape_in_place_versioned(cap), flush=True)  # <-- reshape
elif bug == "checked":
    cap = export()
    print("sum", C.consume_versioned_good(cap), flush=True)  # <-- consume-good
    del cap  # <-- drop-used
else:
    raise SystemExit(f"unknown bug {bug}")
cap = None
print("survived", float(src.sum()), flush=True)
