"""Capsules built in pure Python (capsan.dlpack) round-tripped through
torch.from_dlpack (raw capsule) and np.from_dlpack (an object with
__dlpack__), with the data checked and every deleter call counted.
Prints `RESULT {json}` at the end; correct traffic only (zero findings
under capsan)."""
import ctypes
import gc
import json
import sys
import threading

import numpy as np
import torch

from capsan import dlpack as D

res = {}
res["sizes"] = {t.__name__: ctypes.sizeof(t) for t in (
    D.DLDevice, D.DLDataType, D.DLTensor, D.DLManagedTensor, D.DLPackVersion,
    D.DLManagedTensorVersioned)}
deleted = []


def on_delete(tag):
    return lambda: deleted.append(tag)


# 1. torch takes the raw capsule, renames it, and calls the deleter when the
#    tensor dies; the memory is shared, not copied
src = np.arange(12, dtype=np.float32).reshape(3, 4)
cap = D.to_capsule(src, on_delete=on_delete("torch"))
res["name_before"] = D.capsule_name(cap)
t = torch.from_dlpack(cap)
res["torch_name_after"] = D.capsule_name(cap)
res["torch_equal"] = t.tolist() == src.tolist()
src[0, 0] = 100.0
res["torch_shares"] = float(t[0, 0]) == 100.0
del cap
res["torch_deleted_while_alive"] = deleted.count("torch")
del t
gc.collect()
res["torch_deleted"] = deleted.count("torch")

# 2. numpy: needs __dlpack__/__dlpack_device__; a strided view; a dtype
#    reinterpretation of a bytearray
base = np.arange(24, dtype=np.int64).reshape(4, 6)
view = base[1::2, ::3]
a = np.from_dlpack(D.Exporter(view, on_delete=on_delete("numpy")))
res["numpy_equal"] = a.tolist() == view.tolist() and a.strides == view.strides
res["numpy_deleted_while_alive"] = deleted.count("numpy")
del a
gc.collect()
res["numpy_deleted"] = deleted.count("numpy")

buf = bytearray(np.arange(4, dtype=np.int32).tobytes())
b = np.from_dlpack(D.Exporter(buf, dtype="int32", on_delete=on_delete("bytes")))
res["bytes_values"] = b.tolist()
try:
    buf.extend(b"xxxx")  # the export holds a buffer view: no resize under the tensor
    res["bytes_resize_blocked"] = False
except BufferError:
    res["bytes_resize_blocked"] = True
del b
gc.collect()
res["bytes_deleted"] = deleted.count("bytes")
buf.extend(b"xxxx")  # released: resizable again

# 3. byte_offset: numpy honors it
raw = np.arange(8, dtype=np.float64)
c = np.from_dlpack(D.Exporter(raw, shape=[6], byte_offset=16, on_delete=on_delete("offset")))
res["offset_values"] = c.tolist()
del c
gc.collect()

# 4. torch frees the tensor on another thread: torch 1.13 calls a foreign
#    deleter without the GIL; the deleter takes it itself
t = torch.from_dlpack(D.to_capsule(np.ones(5), on_delete=on_delete("thread")))
holder = [t]
del t
th = threading.Thread(target=holder.clear)
th.start()
th.join()
gc.collect()
res["thread_deleted"] = deleted.count("thread")

# 5. a capsule nobody consumes: its destructor releases it (R3)
cap = D.to_capsule(np.zeros(3), on_delete=on_delete("dropped"))
del cap
gc.collect()
res["dropped_deleted"] = deleted.count("dropped")

# 6. a consumer that fails before renaming (numpy 1.24 cannot import bool):
#    the destructor runs with numpy's exception pending; the exception must
#    reach the caller unchanged and the tensor must still be released
try:
    np.from_dlpack(D.Exporter(np.array([True, False]), on_delete=on_delete("refused")))
    res["refused_error"] = None
except Exception as e:  # noqa: BLE001
    res["refused_error"] = f"{type(e).__name__}: {e}"
gc.collect()
res["refused_deleted"] = deleted.count("refused")

# 7. versioned capsule: read back, then consumed by the C fixture consumer
try:
    import dlconsumer
except ImportError:
    dlconsumer = None
vsrc = np.arange(5, dtype=np.float32)
cap = D.to_capsule(vsrc, versioned=True, on_delete=on_delete("versioned"))
v = D.read_capsule(cap)
res["versioned_read"] = {"name": v.name, "version": [v.managed.version.major,
                                                      v.managed.version.minor],
                         "flags": v.managed.flags, **D.tensor_fields(v.tensor)}
res["versioned_read"]["data"] = v.tensor.data == vsrc.ctypes.data
del v
if dlconsumer is not None:
    res["versioned_sum"] = dlconsumer.consume_versioned_good(cap)
    res["versioned_name_after"] = D.capsule_name(cap)
del cap
gc.collect()
res["versioned_deleted"] = deleted.count("versioned")

# 8. read-only memory: refused through a legacy capsule, READ_ONLY when versioned
ro = np.arange(3.0)
ro.flags.writeable = False
try:
    D.to_capsule(ro)
    res["readonly_legacy"] = "exported"
except BufferError:
    res["readonly_legacy"] = "BufferError"
cap = D.to_capsule(ro, versioned=True)
res["readonly_flags"] = D.read_capsule(cap).managed.flags
del cap
gc.collect()

res["stats"] = D.stats()
print("RESULT " + json.dumps(res))
sys.stdout.flush()
