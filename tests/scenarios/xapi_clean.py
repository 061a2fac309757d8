"""Clean exchanges through DLPack 1.3's C exchange API (torch 2.13's
torch.Tensor.__dlpack_c_exchange_api__ table, consumed by apache-tvm-ffi):
no capsule is made on any of these paths except the torch.from_dlpack ones.

argv[1]: which scenario (default all)
  from_dlpack  tvm_ffi.from_dlpack of torch tensors (table from_py, then the
               struct's deleter when the ffi Tensor dies), some read back by
               torch.from_dlpack
  echo         FFI calls that take and return torch tensors: testing.echo
               (from_py, to_py, two deleters), testing.nop (from_py only),
               testing.apply(echo, x) (a C++ call inside the call)
  kernel       a tvm_ffi.cpp.load_inline CPU kernel whose output comes from
               the environment allocator (the table's managed_tensor_allocator,
               called GIL-free inside the call), then torch.from_dlpack and
               tvm_ffi.from_dlpack of that output
  threads      torch tensors returned through the table dropped in worker
               threads, and 4 threads calling echo, the kernel and
               from_dlpack at once
  all          each of the above
argv[2]: loop count (default 300)

The kernel is built (once; ninja and c++ take about 2 s) into
$CAPSAN_XAPI_BUILD when set, so tests can keep it in build/; otherwise
into a temporary directory removed at exit. Prints only a final "ok".
"""
import os
import sys
import tempfile
import threading

import torch
import tvm_ffi

WHICH = sys.argv[1] if len(sys.argv) > 1 else "all"
N = int(sys.argv[2]) if len(sys.argv) > 2 else 300
SCENARIOS = ("from_dlpack", "echo", "kernel", "threads")
if WHICH not in SCENARIOS + ("all",):
    sys.exit(f"xapi_clean: unknown scenario {WHICH!r} (one of {', '.join(SCENARIOS)}, all)")

# the kernel returns a tensor from ffi::Tensor::FromEnvAlloc: inside an FFI
# call that got a torch tensor, TVMFFIEnvTensorAlloc is torch's
# managed_tensor_allocator (a call with no torch argument has no allocator)
KERNEL_SRC = r"""
namespace ffi = tvm::ffi;

ffi::Tensor add_one(ffi::TensorView x) {
  TVM_FFI_ICHECK(x.ndim() == 1) << "x must be 1-D";
  DLDataType f32{kDLFloat, 32, 1};
  TVM_FFI_ICHECK(x.dtype() == f32) << "x must be float32";
  ffi::Tensor y = ffi::Tensor::FromEnvAlloc(TVMFFIEnvTensorAlloc, x.shape(), x.dtype(), x.device());
  const float* src = static_cast<const float*>(x.data_ptr());
  float* dst = static_cast<float*>(y.data_ptr());
  for (int64_t i = 0; i < x.size(0); ++i) dst[i] = src[i] + 1.0f;
  return y;
}

ffi::Tensor scaled_sum(ffi::TensorView a, ffi::TensorView b, double s) {
  TVM_FFI_ICHECK(a.ndim() == 1 && b.ndim() == 1 && a.size(0) == b.size(0)) << "1-D, same length";
  ffi::Tensor y = ffi::Tensor::FromEnvAlloc(TVMFFIEnvTensorAlloc, a.shape(), a.dtype(), a.device());
  const float* pa = static_cast<const float*>(a.data_ptr());
  const float* pb = static_cast<const float*>(b.data_ptr());
  float* dst = static_cast<float*>(y.data_ptr());
  for (int64_t i = 0; i < a.size(0); ++i) dst[i] = static_cast<float>(s * (pa[i] + pb[i]));
  return y;
}
"""

_tmp = None
_mod = None


def kernel():
    """The load_inline module, built on first use."""
    global _mod, _tmp
    if _mod is None:
        import tvm_ffi.cpp

        build = os.environ.get("CAPSAN_XAPI_BUILD")
        if not build:
            _tmp = tempfile.TemporaryDirectory(prefix="capsan-xapi-")
            build = _tmp.name
        # load_inline runs `ninja` from PATH: the venv's own (pip ninja) first
        bindir = os.path.dirname(sys.executable)
        os.environ["PATH"] = bindir + os.pathsep + os.environ.get("PATH", "")
        _mod = tvm_ffi.cpp.load_inline(
            name="capsan_xapi_kernel",
            cpp_sources=KERNEL_SRC,
            functions=["add_one", "scaled_sum"],
            build_directory=os.path.join(build, "capsan_xapi_kernel"),
        )
    return _mod


def check(cond, what):
    if not cond:
        raise AssertionError(what)


def run_from_dlpack(n):
    for i in range(n):
        x = torch.arange(i % 7 + 1, dtype=torch.float32) + i
        t = tvm_ffi.from_dlpack(x)
        check(tuple(t.shape) == tuple(x.shape) and str(t.dtype) == "float32", "from_dlpack shape/dtype")
        if i % 5 == 0:  # back into torch: this one is a dltensor_versioned capsule
            z = torch.from_dlpack(t)
            check(z.data_ptr() == x.data_ptr() and z[0].item() == float(i), "from_dlpack round trip")
            del z
        if i % 3 == 0:  # other dtypes and a 2-D, contiguity-checked view
            m = torch.ones((3, 4), dtype=torch.int64) * i
            u = tvm_ffi.from_dlpack(m, require_contiguous=True)
            check(tuple(u.shape) == (3, 4) and str(u.dtype) == "int64", "from_dlpack 2-D int64")
            del u, m
        del t, x


def run_echo(n):
    echo = tvm_ffi.get_global_func("testing.echo")
    nop = tvm_ffi.get_global_func("testing.nop")
    apply = tvm_ffi.get_global_func("testing.apply")
    for i in range(n):
        x = torch.full((i % 5 + 1, 2), float(i))
        y = echo(x)
        check(type(y) is torch.Tensor and y.data_ptr() == x.data_ptr(), "echo returns the same memory")
        check(y[0, 0].item() == float(i), "echo value")
        del y
        nop(x)
        if i % 4 == 0:
            w = apply(echo, x)
            check(w.data_ptr() == x.data_ptr(), "apply(echo) returns the same memory")
            del w
        if i % 6 == 0:  # a strided view: its shape and strides cross too
            v = echo(x[:, 1])
            check(v.stride() == (2,) and v.data_ptr() == x[:, 1].data_ptr(), "echo of a strided view")
            del v
        del x


def run_kernel(n):
    mod = kernel()
    for i in range(n):
        x = torch.arange(i % 9 + 1, dtype=torch.float32)
        y = mod.add_one(x)
        check(type(y) is torch.Tensor and y.data_ptr() != x.data_ptr(), "kernel output is a new torch tensor")
        check(torch.equal(y, x + 1), "kernel values")
        z = torch.from_dlpack(y)
        check(z.data_ptr() == y.data_ptr(), "torch.from_dlpack of the kernel output")
        del z
        if i % 3 == 0:
            s = mod.scaled_sum(x, y, 0.5)
            check(torch.allclose(s, (x + y) * 0.5), "scaled_sum values")
            t = tvm_ffi.from_dlpack(s)  # the env-allocated tensor back into tvm-ffi
            back = torch.from_dlpack(t)
            check(back.data_ptr() == s.data_ptr(), "ffi round trip of the kernel output")
            del t, back, s
        del y, x


def run_threads(n):
    echo = tvm_ffi.get_global_func("testing.echo")
    mod = kernel()
    errors = []

    # 1. tensors born through the table, dropped in other threads
    keep = []
    for i in range(max(n // 4, 8)):
        x = torch.arange(4, dtype=torch.float32) + i
        keep.append(echo(x))
        keep.append(mod.add_one(x))
        keep.append(tvm_ffi.from_dlpack(x))
    chunks = [keep[k::4] for k in range(4)]
    keep.clear()
    ths = [threading.Thread(target=lambda c: c.clear(), args=(c,)) for c in chunks]
    for th in ths:
        th.start()
    for th in ths:
        th.join()

    # 2. four threads calling at once, handing some results across threads
    shared = []
    lock = threading.Lock()

    def worker(k):
        try:
            for i in range(n):
                x = torch.full((8,), float(k * 100000 + i))
                y = echo(x)
                z = mod.add_one(x)
                t = tvm_ffi.from_dlpack(z)
                if y.data_ptr() != x.data_ptr() or z[0].item() != float(k * 100000 + i) + 1:
                    errors.append((k, i))
                if i % 13 == 0:
                    with lock:
                        shared.append((y, z, t))
                        if len(shared) > 8:
                            shared.pop(0)
                del y, z, t
        except Exception as e:  # noqa: BLE001
            errors.append(repr(e))

    ths = [threading.Thread(target=worker, args=(k,)) for k in range(4)]
    for th in ths:
        th.start()
    for th in ths:
        th.join()
    shared.clear()
    check(not errors, f"thread errors: {errors[:5]}")


RUN = {"from_dlpack": run_from_dlpack, "echo": run_echo, "kernel": run_kernel, "threads": run_threads}
for name in SCENARIOS if WHICH == "all" else (WHICH,):
    RUN[name](N)
if _tmp is not None:
    _tmp.cleanup()
print("ok")
