"""Ready-made NumPy data-memory handlers, built with capsan.allocator().

    with capsan.using(capsan.allocators.aligned(4096)):
        a = np.empty(1000)               # a.ctypes.data % 4096 == 0

    shm = capsan.allocators.shared_memory("frames")     # /dev/shm/frames
    with capsan.using(shm):
        a = np.arange(1e6)
    shm.path, shm.offset(a)              # another process: capsan.allocators.attach(...)

Both are Python-callable handlers: each allocation costs about a
microsecond more than numpy's default (see ``make bench``).
"""
from __future__ import annotations

import bisect
import ctypes
import mmap
import os
import threading
from ctypes import c_int, c_size_t, c_void_p

from .allocator import _set_on_close, allocator

_libc = ctypes.CDLL(None, use_errno=True)
_posix_memalign = _libc.posix_memalign
_posix_memalign.restype, _posix_memalign.argtypes = c_int, [ctypes.POINTER(c_void_p), c_size_t,
                                                             c_size_t]
_realloc = _libc.realloc
_realloc.restype, _realloc.argtypes = c_void_p, [c_void_p, c_size_t]
_free = _libc.free
_free.restype, _free.argtypes = None, [c_void_p]
_memset = ctypes.memset
_memmove = ctypes.memmove


def aligned(alignment: int = 64, *, name: str | None = None, device: str | None = None):
    """A handler whose every data pointer is a multiple of `alignment` (a
    power of two >= 8): malloc and calloc through ``posix_memalign``; realloc
    through libc ``realloc``, moved to an aligned block when the result is
    not aligned (the contents are copied, the old block freed); free is
    libc ``free``. Named ``aligned<alignment>`` unless `name` is given."""
    if alignment < ctypes.sizeof(c_void_p) or alignment & (alignment - 1):
        raise ValueError("alignment must be a power of two >= 8")
    A = int(alignment)

    def _alloc(n, memalign=_posix_memalign, c_void_p=c_void_p):
        p = c_void_p()
        if memalign(ctypes.byref(p), A, n or 1) != 0:
            return 0
        return p.value

    def malloc(n):
        return _alloc(n)

    def calloc(nelem, elsize):
        n = nelem * elsize
        if elsize and n // elsize != nelem:
            return 0  # overflow
        p = _alloc(n)
        if p:
            _memset(p, 0, n or 1)
        return p

    def realloc(ptr, n):
        if not ptr:
            return _alloc(n)
        r = _realloc(ptr, n or 1)
        if not r or r % A == 0:
            return r or 0
        q = _alloc(n)
        if not q:
            _free(r)  # the old contents are gone either way; numpy raises MemoryError
            return 0
        _memmove(q, r, n)
        _free(r)
        return q

    def free(ptr, size):
        if ptr:
            _free(ptr)

    return allocator(name or f"aligned{A}", malloc=malloc, calloc=calloc, realloc=realloc,
                     free=free, device=device)


class SharedMemoryAllocator:
    """Arrays in one shared mapping of a file (see shared_memory()).

    ``handler`` is the mem_handler capsule (``capsan.using(shm)`` takes this
    object or the capsule); ``path`` the file another process maps;
    ``offset(arr)`` where arr's data starts in it; ``used``/``capacity`` in
    bytes. The mapping lives as long as the handler: until this object and
    every array allocated through it are gone.
    """

    ALIGN = 64

    def __init__(self, path: str, size: int, name: str | None, unlink: bool):
        self.path = path
        self.capacity = size
        self._unlink = unlink
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            os.ftruncate(fd, size)
            self._mm = mmap.mmap(fd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        finally:
            os.close(fd)
        self._anchor = ctypes.c_char.from_buffer(self._mm)
        self.base = ctypes.addressof(self._anchor)
        self._lock = threading.Lock()
        self._free = [(0, size)]        # sorted (offset, size) free blocks
        self._used: dict[int, int] = {}  # offset -> block size
        region = _Region(self)
        self.handler = allocator(name or f"shared_memory:{os.path.basename(path)}",
                                 malloc=region.malloc, calloc=region.calloc,
                                 realloc=region.realloc, free=region.free)
        # the mapping is closed by the capsule's destructor, not by this object
        _set_on_close(self.handler, region.close)

    @property
    def used(self) -> int:
        return sum(self._used.values())

    def offset(self, arr) -> int:
        """Offset of arr's first byte in the shared file (arr may be a view)."""
        addr = arr.__array_interface__["data"][0]
        off = addr - self.base
        if not 0 <= off < self.capacity:
            raise ValueError("this array's data is not in the shared mapping")
        return off

    def describe(self, arr) -> dict:
        """What another process needs to see arr: path, offset, shape, dtype, strides."""
        return {"path": self.path, "offset": self.offset(arr), "shape": list(arr.shape),
                "dtype": arr.dtype.str, "strides": list(arr.strides)}

    def __repr__(self):
        return (f"<SharedMemoryAllocator {self.path} used={self.used} "
                f"capacity={self.capacity}>")


class _Region:
    """The allocator proper. Holds the SharedMemoryAllocator's state, not the
    object itself, so that the handler (and so the mapping) outlives it."""

    def __init__(self, owner: SharedMemoryAllocator):
        self.mm, self.anchor = owner._mm, owner._anchor
        self.base, self.cap = owner.base, owner.capacity
        self.lock, self.freel, self.used = owner._lock, owner._free, owner._used
        self.path, self.unlink = owner.path, owner._unlink

    def _take(self, n):
        n = max(SharedMemoryAllocator.ALIGN, -(-n // SharedMemoryAllocator.ALIGN)
                * SharedMemoryAllocator.ALIGN)
        for i, (off, sz) in enumerate(self.freel):
            if sz >= n:
                if sz == n:
                    del self.freel[i]
                else:
                    self.freel[i] = (off + n, sz - n)
                self.used[off] = n
                return off
        return None

    def _give(self, off):
        n = self.used.pop(off)
        fl = self.freel
        i = bisect.bisect(fl, (off, 0))
        if i < len(fl) and off + n == fl[i][0]:  # merge with the next
            n += fl[i][1]
            del fl[i]
        if i > 0 and fl[i - 1][0] + fl[i - 1][1] == off:  # and the previous
            off, n = fl[i - 1][0], fl[i - 1][1] + n
            del fl[i - 1]
            i -= 1
        fl.insert(i, (off, n))

    def malloc(self, n):
        with self.lock:
            off = self._take(n)
        return 0 if off is None else self.base + off

    def calloc(self, nelem, elsize):
        n = nelem * elsize
        p = self.malloc(n)
        if p:
            _memset(p, 0, max(n, 1))
        return p

    def realloc(self, ptr, n):
        if not ptr:
            return self.malloc(n)
        off = ptr - self.base
        with self.lock:
            cur = self.used.get(off)
            if cur is None:
                return 0  # not ours: refuse rather than corrupt
            if n <= cur:
                return ptr
            new = self._take(n)
            if new is None:
                return 0
            _memmove(self.base + new, ptr, cur)
            self._give(off)
        return self.base + new

    def free(self, ptr, size):
        if not ptr:
            return
        with self.lock:
            if ptr - self.base in self.used:
                self._give(ptr - self.base)

    def close(self):
        # the last array is gone: unmap (and remove a file we created by name)
        self.anchor = None
        try:
            self.mm.close()
        except BufferError:
            pass
        if self.unlink:
            try:
                os.unlink(self.path)
            except OSError:
                pass


def shared_memory(path_or_name: str, size: int = 64 << 20, *, name: str | None = None,
                  unlink: bool | None = None) -> SharedMemoryAllocator:
    """A handler whose arrays live in one ``MAP_SHARED`` mapping of a file,
    so another process can map the same file and read (or write) them.

    path_or_name -- a path (contains '/'), or a name for ``/dev/shm/<name>``
                    (POSIX shared memory)
    size         -- capacity in bytes; the file is created or resized to it.
                    An allocation that does not fit returns NULL: numpy
                    raises MemoryError
    unlink       -- remove the file when the handler dies (default: True for
                    a /dev/shm name, False for a path)

    Returns a SharedMemoryAllocator: pass it (or its ``.handler``) to
    ``capsan.using()``; ``describe(arr)`` tells a reader where arr is, and
    ``attach(**shm.describe(arr))`` in the other process maps it.
    """
    if "/" in path_or_name:
        path = os.path.abspath(path_or_name)
        unlink = False if unlink is None else unlink
    else:
        path = os.path.join("/dev/shm", path_or_name)
        unlink = True if unlink is None else unlink
    return SharedMemoryAllocator(path, int(size), name, unlink)


def attach(path: str, offset: int, shape, dtype, strides=None, mode: str = "r"):
    """In any process: the array at `offset` of the shared file `path`
    (mode "r" read-only, "r+" read-write), a numpy.memmap of the file."""
    import numpy as np
    dt = np.dtype(dtype)
    shape = tuple(shape)
    if strides is None:
        return np.memmap(path, dtype=dt, mode=mode, offset=offset, shape=shape)
    if any(st < 0 for st in strides):
        raise ValueError("attach() maps views with non-negative strides only")
    # a strided view: map from offset to the last byte it reaches
    span = dt.itemsize + sum((n - 1) * st for n, st in zip(shape, strides) if n)
    raw = np.memmap(path, dtype=np.uint8, mode=mode, offset=offset, shape=(span,))
    return np.ndarray(shape, dt, buffer=raw, offset=0, strides=tuple(strides))


__all__ = ["aligned", "shared_memory", "attach", "SharedMemoryAllocator"]
