"""A producer whose capsule destructor ignores the capsule's name
(dlpack-unchecked-destructor) releases a tensor its consumer still holds,
and frees the managed struct. malloc hands that block to the next request
of its size, here filled with 0x41 bytes; when the consumer then releases
what it holds, it jumps through whatever the block holds now: natively a
SIGSEGV at 0x4141414141414141. capsan keeps released structs in
quarantine, their deleter field pointing at its trampoline, so that
release is reported as dlpack-double-delete before it runs (protect=1
skips the destructor's release in the first place)."""
import ctypes

import dlconsumer as C
import dlproducer as P

MGR = 104  # sizeof(Mgr) in dlproducer.c: the managed struct's block
libc = ctypes.CDLL(None)
libc.malloc.restype = ctypes.c_void_p
libc.malloc.argtypes = [ctypes.c_size_t]
libc.free.argtypes = [ctypes.c_void_p]
libc.free(libc.malloc(MGR))  # ctypes' own first-call allocations happen now

cap = P.unchecked(8)  # <-- export
print("held", C.consume_hold(cap), flush=True)  # <-- consume
del cap  # <-- destroy
reused = [libc.malloc(MGR) for _ in range(16)]
for block in reused:
    ctypes.memset(block, 0x41, MGR)
print("released", C.release_holds(), flush=True)  # <-- release
print("survived", P.deleted_count(), flush=True)
