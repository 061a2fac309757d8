"""apache-tvm-ffi 0.1.8.post1 loses a failed call's error when a torch
argument was converted through torch's DLPack exchange table: its binding
(TVMFFIPyCallManager::FuncCall) sets torch's allocator around the call and
stores the restore's return code over the call's, so the call returns
None and its error stays raised, never fetched (fixed in 0.1.8.post2).

    python rw_ffi_error_lost.py MODE [BUILD_DIR]

kernel:   a tvm_ffi.cpp.load_inline kernel that scales a float32 tensor in
          place and throws TypeError for any other dtype, called with an
          int64 tensor (built in BUILD_DIR, else a temporary directory)
callback: a Python function registered as a global tvm-ffi function,
          which raises ValueError for a tensor with a negative element

0.1.8.post1 prints "lost None" and 0.1.8.post2 "refused TypeError" (or
ValueError). The program then goes on with torch alone, making no other
tvm-ffi call, and prints "ok"."""
import os
import sys
import tempfile

import torch
import tvm_ffi

KERNEL_SRC = r"""
void scale_(tvm::ffi::TensorView x, double s) {
  if (x.dtype().code != kDLFloat || x.dtype().bits != 32)
    TVM_FFI_THROW(TypeError) << "scale_: expected a float32 tensor";
  float* p = static_cast<float*>(x.data_ptr());
  for (int64_t i = 0; i < x.size(0); ++i) p[i] = static_cast<float>(p[i] * s);
}
"""


def kernel_scale():
    import tvm_ffi.cpp

    build = sys.argv[2] if len(sys.argv) > 2 else tempfile.mkdtemp(prefix="rw-tvm-")
    # load_inline runs `ninja` from PATH: the venv's own (pip ninja) first
    os.environ["PATH"] = os.path.dirname(sys.executable) + os.pathsep + os.environ["PATH"]
    mod = tvm_ffi.cpp.load_inline(name="rw_scale", cpp_sources=KERNEL_SRC, functions=["scale_"],
                                  build_directory=os.path.join(build, "rw_scale"))
    return mod.scale_


def callback_scale():
    @tvm_ffi.register_global_func("rw.scale_")
    def scale_(x, s):
        t = torch.from_dlpack(x)
        if bool((t < 0).any()):
            raise ValueError("scale_: negative input")
        t.mul_(s)

    return tvm_ffi.get_global_func("rw.scale_")


mode = sys.argv[1]
if mode == "kernel":
    scale_ = kernel_scale()
    good, bad = torch.arange(8, dtype=torch.float32), torch.arange(8, dtype=torch.int64)
elif mode == "callback":
    scale_ = callback_scale()
    good, bad = torch.arange(8, dtype=torch.float32), torch.arange(-4, 4, dtype=torch.float32)
else:
    raise SystemExit(f"unknown mode {mode}")

scale_(good, 2.0)
assert good.sum().item() == 56.0, good
try:
    r = scale_(bad, 2.0)  # <-- call
    print("lost", r, flush=True)
except (TypeError, ValueError) as e:
    print("refused", type(e).__name__, flush=True)
# torch alone from here on: nothing calls tvm-ffi again
print("unscaled", int(bad.sum().item()), flush=True)
print("ok")
