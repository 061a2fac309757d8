"""N calls of tvm-ffi's testing.echo on one torch tensor, for counting.
Each call goes through torch's DLPack exchange table only: one
managed_tensor_from_py_object_no_sync (the argument), one
managed_tensor_to_py_object_no_sync (the result), and two deleters when
the result dies right after (tvm-ffi's struct, then torch's). No capsule
is made; tvm-ffi looks the table up once (PyCapsule_GetPointer
"dlpack_exchange_api") and caches it for torch.Tensor.
argv[1]: N (default 1000). Prints only "ok"."""
import sys

import torch
import tvm_ffi

N = int(sys.argv[1]) if len(sys.argv) > 1 else 1000
echo = tvm_ffi.get_global_func("testing.echo")
x = torch.arange(16, dtype=torch.float32)
for _ in range(N):
    y = echo(x)
    if y.data_ptr() != x.data_ptr():
        sys.exit("xapi_echo_loop: echo returned other memory")
    del y
print("ok")
