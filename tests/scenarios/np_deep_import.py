"""NumPy blocks kept forever by an extension at the bottom of a deep call
stack: those made while a module is imported are module data (the import
machinery's frames lie below), the others leaks. Deeper than the Python
frames a stack keeps, and with stacks off, only the frames capsan walks
for the import check tell them apart."""
import importlib
import os
import sys

import numpy as np

import np_leaky as L

d = os.path.join(os.environ["TMPD"], "mods")
os.makedirs(d, exist_ok=True)
sys.path.insert(0, d)
for k in range(8):
    with open(os.path.join(d, f"datamod{k}.py"), "w") as f:
        f.write("import numpy as np\nimport np_leaky as L\nL.keep_forever(np.ones(16))\n")


def at_depth(n, fn):
    return fn() if n == 0 else at_depth(n - 1, fn)


def leak():
    L.keep_forever(np.ones(16))  # <-- leak


for k in range(8):
    # 200: past the 128 frames the import check remembers
    depth = (5, 30, 70, 200)[k % 4]
    at_depth(depth, lambda: importlib.import_module(f"datamod{k}"))
    at_depth(depth, leak)
print("done")
