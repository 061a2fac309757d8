"""The correct paths of the fixture producer and consumer, legacy and versioned.
Asserts the deleter count itself: every export is released exactly once."""
import numpy as np
import torch

import dlconsumer as C
import dlproducer as P

exports = 0

# consumed and released by the fixture consumer
assert C.consume_good(P.good(8)) == 28.0
assert C.consume_good(P.good(8, dtype="int64")) == 28.0
exports += 2

# never consumed: the producer's destructor releases it
cap = P.good(5)
del cap
exports += 1

# a destructor set after the capsule was made runs, consumed or not
cap = P.swapped(5)
del cap
assert C.consume_good(P.swapped(8)) == 28.0
exports += 2

# numpy and torch as consumers of the fixture's __dlpack__ object
a = np.from_dlpack(P.Exporter(6))
assert a.tolist() == [0, 1, 2, 3, 4, 5]
del a
t = torch.from_dlpack(P.Exporter(6, dtype="int64"))
assert t.tolist() == [0, 1, 2, 3, 4, 5]
del t
t = torch.from_dlpack(P.good(4))  # a raw capsule
assert t.tolist() == [0, 1, 2, 3]
del t
exports += 3

# numpy honors byte_offset: no byte-offset finding for this consumer
a = np.from_dlpack(P.Exporter(6, "offset"))
assert a.tolist() == [0, 1, 2, 3, 4, 5], a
del a
# the fixture consumer honors byte_offset too
assert C.consume_good(P.offset(8)) == 28.0
exports += 2

# fixture consumer of numpy's and torch's capsules
assert C.consume_good(np.arange(8, dtype=np.float32).__dlpack__()) == 28.0
assert C.consume_good(torch.arange(8, dtype=torch.float32).__dlpack__()) == 28.0

# versioned good path: consumed and released, and unconsumed then destroyed
assert C.consume_versioned_good(P.versioned(8)) == 28.0
assert C.consume_versioned_good(P.versioned(8, minor=1)) == 28.0
vcap = P.versioned(3)
del vcap
exports += 3

assert P.deleted_count() == exports, (P.deleted_count(), exports)
print("fixtures ok", exports)
