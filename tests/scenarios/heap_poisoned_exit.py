"""A program that leaves glibc's heap broken, then ends with os._exit():
capsan's _exit verdict must not need that heap (test_own_heap.py).

Three tensors are consumed and never released (live-at-exit: their
capsules still hold them). Then every tcache bin of 24 to 1016 bytes gets
a head whose next link decodes to an unaligned address: the second
malloc() of any of those sizes aborts ("malloc(): unaligned tcache chunk
detected"). Nothing of the program's allocates after that.
"""
import ctypes
import os

import dlconsumer as C
import dlproducer as P

libc = ctypes.CDLL(None)
libc.malloc.restype = ctypes.c_void_p
libc.malloc.argtypes = [ctypes.c_size_t]
libc.free.argtypes = [ctypes.c_void_p]
held = [P.good(16) for _ in range(3)]  # <-- export
for cap in held:
    C.consume_leak(cap)
blocks = [libc.malloc(size) for size in range(24, 1032, 16)]
for p in blocks:
    libc.free(p)
for p in blocks:
    # safe-linking (glibc 2.32+) stores next ^ (where >> 12): this decodes to 1
    ctypes.c_uint64.from_address(p).value = 1 ^ (p >> 12)
os._exit(0)
