"""numpy -> torch -> numpy, where numpy's owner capsule (the base of the
array np.from_dlpack made) is allocated where the first export's capsule
lay: that capsule was consumed and died, and capsule objects' memory is
reused. When the array dies, its owner capsule's destructor releases
torch's export, and with it the storage that held numpy's first export:
that release is torch's, the consumer's, not the first capsule's
destructor ignoring its consumed name (dlpack-unchecked-destructor, as
capsan used to say when threads made the addresses meet).
argv[1] == "versioned": the first export is a DLPack 1.x one."""
import sys

import numpy as np
import torch
import torch.utils.dlpack

a = np.ones(10)
cap1 = a.__dlpack__(max_version=(1, 0)) if sys.argv[1:] == ["versioned"] else a.__dlpack__()
x = torch.utils.dlpack.from_dlpack(cap1)  # torch consumes it and holds the tensor
cap2 = x.__dlpack__()  # torch's export of the same storage
del x


class Producer:
    def __dlpack__(self, **kw):
        return cap2

    def __dlpack_device__(self):
        return (1, 0)


p = Producer()
where = id(cap1)
del cap1  # the consumed capsule dies: its memory is free for the next capsule
y = np.from_dlpack(p)  # numpy's owner capsule, the array's base
print("owner capsule where the first lay:", id(y.base) == where, flush=True)
del cap2, p
del y  # its owner capsule dies: torch releases the storage, and numpy's first export
print("done", flush=True)
