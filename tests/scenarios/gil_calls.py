"""Python C-API calls without the GIL, each committed for real."""
import sys

import nogil

what = sys.argv[1]
if what == "capsule":
    import torch
    cap = torch.arange(3).__dlpack__()
    nogil.capsule_call_nogil(cap)  # <-- nogil-capsule
elif what == "capsule-numpy":
    import numpy as np
    cap = np.arange(3).__dlpack__()
    nogil.capsule_call_nogil(cap)  # <-- nogil-capsule-numpy
    del cap  # consumed by nobody: dropped before exit
elif what == "deleter":
    import torch
    t = torch.from_dlpack(nogil.export_bad_deleter())  # <-- export
    del t  # <-- torch-frees
elif what == "deleter-objfree":
    import torch
    t = torch.from_dlpack(nogil.export_objfree_deleter(False))  # <-- objfree-export
    del t  # <-- torch-objfrees
elif what == "deleter-objfree-gil":
    import torch
    t = torch.from_dlpack(nogil.export_objfree_deleter(True))
    del t
print("done")
