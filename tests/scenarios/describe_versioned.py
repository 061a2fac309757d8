"""capsan.describe() on the current stack's versioned exports: version and
flags (READ_ONLY, IS_COPIED) of numpy 2 and torch 2.x capsules, the
copy= request held to IS_COPIED (R24), numpy's owner capsule of an array
imported from torch, and JAX (which answers with a legacy capsule).
Prints one RESULT line (JSON)."""
import json
import os

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402

from capsan import describe  # noqa: E402


def brief(d):
    return {"name": d["capsule"]["name"], "versioned": d["capsule"]["versioned"],
            "version": d["version"], "flags": d["flags"], "flag_names": d["flag_names"],
            "producer": d["producer"], "verdict": d["verdict"],
            "checks": {c["rule"]: c["verdict"] for c in d.checks},
            "text": d.text, "shape": d["tensor"]["shape"] if d["tensor"] else None}


res = {}
ro = np.arange(6, dtype=np.float32).reshape(2, 3)
ro.flags.writeable = False
res["numpy_readonly"] = brief(describe(ro))
# a raw capsule: what a consumer asking for (1, 0) gets
res["numpy_readonly_capsule"] = brief(describe(ro.__dlpack__(max_version=(1, 0))))
rw = np.arange(4, dtype=np.int32)
res["numpy_plain"] = brief(describe(rw))
res["numpy_copy"] = brief(describe(rw, copy=True))
res["numpy_nocopy"] = brief(describe(rw, copy=False))
res["numpy_legacy"] = brief(describe(rw, max_version=None))
try:
    describe(ro, max_version=None)
    res["numpy_readonly_legacy"] = "exported"
except BufferError as e:  # R21: a legacy capsule cannot say read-only
    res["numpy_readonly_legacy"] = "BufferError"

t = torch.arange(6, dtype=torch.float64).reshape(3, 2)
res["torch"] = brief(describe(t))
res["torch_copy"] = brief(describe(t, copy=True))
res["torch_capsule"] = brief(describe(t.__dlpack__(max_version=(1, 0))))
imported = np.from_dlpack(t)
res["owner"] = brief(describe(imported.base))
res["jax"] = brief(describe(jnp.arange(5, dtype=jnp.float32)))
res["versions"] = {"numpy": np.__version__, "torch": torch.__version__}
del imported
print("RESULT " + json.dumps(res), flush=True)
