"""capsan.describe() on numpy and torch objects, raw capsules (unversioned,
versioned, consumed) and, with the argument `bad`, malformed fixture capsules.

`clean` (default): only correct traffic, so a run under capsan must have zero
findings; describing objects many times proves describe() disposes of the
capsules it asks for. Prints `RESULT {json}`."""
import gc
import json
import sys

import numpy as np
import torch

from capsan.describe import describe
from capsan import dlpack as D


mode = sys.argv[1] if len(sys.argv) > 1 else "clean"
res = {}

if mode == "clean":
    t = torch.arange(6).reshape(2, 3)
    d = describe(t)
    res["torch_text"] = d.text
    res["torch"] = d.as_dict()
    res["torch_str_is_text"] = str(d) == d.text
    a = np.arange(12.0).reshape(3, 4)[:, ::2]
    res["numpy"] = describe(a).as_dict()
    res["numpy_text"] = describe(a).text
    res["numpy_empty"] = describe(np.zeros((2, 0), dtype=np.int32)).as_dict()
    res["torch_0d"] = describe(torch.tensor(7.5)).as_dict()

    # many objects described: every capsule must be released by its producer
    for i in range(300):
        describe(np.full(100, i, dtype=np.float32))
        describe(torch.full((10,), i))

    # a raw torch capsule: read, not consumed, then consumed by numpy? (numpy
    # needs __dlpack__) -> consumed by torch itself
    cap = torch.arange(4.0).__dlpack__()
    d = describe(cap)
    res["raw"] = d.as_dict()
    res["raw_name_after"] = D.capsule_name(cap)
    back = torch.from_dlpack(cap)
    res["raw_consumed_later"] = back.tolist()
    res["used"] = describe(cap).as_dict()
    res["used_text"] = describe(cap).text
    del cap, back

    # a pure-Python versioned capsule, described then dropped; another consumed
    deleted = []
    cap = D.to_capsule(np.arange(3, dtype=np.int16), versioned=True,
                       on_delete=lambda: deleted.append("v1"))
    res["versioned"] = describe(cap).as_dict()
    res["versioned_text"] = describe(cap).text
    del cap
    gc.collect()
    cap = D.to_capsule(np.arange(3, dtype=np.int16), versioned=True,
                       on_delete=lambda: deleted.append("v2"))
    d = describe(cap, consume=True)
    res["consume"] = {"name_after": D.capsule_name(cap), "deleted": list(deleted),
                      "flag": d["consumed_by_describe"]}
    del cap
    gc.collect()
    res["deleted"] = deleted
    # an exporter honouring max_version: describe asks for (1, 3) first
    res["exporter"] = describe(D.Exporter(np.arange(4.0))).as_dict()
    # a raw capsule from torch, consumed by describe itself
    cap = torch.arange(5).__dlpack__()
    describe(cap, consume=True)
    res["torch_consumed_name"] = D.capsule_name(cap)
    del cap
    try:
        describe(42)
        res["not_dlpack"] = None
    except TypeError as e:
        res["not_dlpack"] = str(e)
    res["stats"] = D.stats()
else:
    # stop the runtime that `import capsan` started: capsules made from now
    # on keep their own destructors and deleters, which describe() names
    import capsan
    capsan.stop()
    import dlproducer
    d = describe(torch.arange(6).reshape(2, 3))
    res["torch_nocapsan_text"] = d.text
    res["torch_nocapsan"] = {"producer": d["producer"], "destructor": d["capsule"]["destructor"],
                             "deleter": d["deleter"]}
    d = describe(np.arange(3.0))
    res["numpy_nocapsan"] = {"producer": d["producer"], "deleter": d["deleter"]}
    d = describe(dlproducer.good(4))
    res["fixture_nocapsan_text"] = d.text
    res["fixture_nocapsan"] = {"producer": d["producer"], "deleter": d["deleter"]}
    res["python_capsule_text"] = describe(D.to_capsule(np.arange(2.0))).text
    for kind in dlproducer.bad_kinds():
        d = describe(dlproducer.bad(kind))
        res["bad_" + kind] = {"verdict": d.verdict,
                              "failed": sorted(c["rule"] for c in d.checks
                                               if c["verdict"] == "fail"),
                              "text": d.text}
    d = describe(dlproducer.versioned(4, 2, 0))
    res["major2"] = {"verdict": d.verdict, "R13": d.check("R13"), "tensor": d["tensor"]}
    d = describe(dlproducer.versioned(4, 1, 0, 1 << 5))
    res["flags"] = {"verdict": d.verdict, "R21": d.check("R21")}
    d = describe(dlproducer.offset(4))
    res["offset"] = {"verdict": d.verdict, "R17": d.check("R17")}
    d = describe(dlproducer.null_deleter(4))
    res["null_deleter"] = {"R10": d.check("R10"), "deleter": d["deleter"]}
    # DLPack >= 1.2 needs strides: build one, then clear its strides
    cap = D.to_capsule(np.arange(6.0), versioned=True, version=(1, 2))
    D.read_capsule(cap).managed.dl_tensor.strides = None
    res["strides_v12"] = describe(cap).check("R16")
    del cap

    class Liar:  # __dlpack_device__ disagrees with its capsule
        def __dlpack__(self, stream=None):
            return np.arange(3.0).__dlpack__()

        def __dlpack_device__(self):
            return (D.kDLCUDAHost, 0)

    res["liar"] = describe(Liar()).check("R22")

    class TooNew:  # versioned although no max_version was asked for
        def __dlpack__(self, stream=None):
            return D.to_capsule(np.arange(3.0), versioned=True)

        def __dlpack_device__(self):
            return (1, 0)

    res["too_new"] = describe(TooNew()).check("R14")
    gc.collect()
    res["stats"] = D.stats()

print("RESULT " + json.dumps(res, default=str))
