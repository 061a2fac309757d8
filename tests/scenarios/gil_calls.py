"""Python C-API calls without the GIL, each committed for real."""
import sys

import torch

import nogil

what = sys.argv[1]
if what == "capsule":
    cap = torch.arange(3).__dlpack__()
    nogil.capsule_call_nogil(cap)  # <-- nogil-capsule
elif what == "deleter":
    t = torch.from_dlpack(nogil.export_bad_deleter())  # <-- export
    del t  # <-- torch-frees
print("done")
