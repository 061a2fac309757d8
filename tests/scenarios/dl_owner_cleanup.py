"""A consumer that keeps the capsules it consumed and releases their
tensors at cleanup, reading each pointer back by the consumed name
(PyCapsule_GetPointer(cap, "used_dltensor")): the owner using what it owns,
released once each. Clean (issue 20: this was a false dlpack-reconsume)."""
import numpy as np

import dlconsumer as C
import dlproducer as P

caps = [P.good(8), np.arange(8, dtype=np.float32).__dlpack__()]
sums = [C.consume_keep(cap) for cap in caps]
del caps
print("kept", sums, "released", C.release_kept(), "deleted", P.deleted_count(), flush=True)
