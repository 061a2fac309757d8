"""Reproducer: capsan's native unwinder uses descriptors that belong to the
program.

libunwind (dlopen'd by preload/stacks/unwind.c for native stacks) validates every
address it reads during unw_step (CONSERVATIVE_CHECKS): mincore, then a
1-byte write() of that address into a pipe it opened once, at the lowest
free descriptors, and keeps in a static array; before each write it
read()s one byte from the pipe's other end, and when that read fails it
close()s both old numbers and makes a new pipe. It never checks that the
descriptors are still its own. So:

1. the program closes every descriptor above 2 and makes pipes of its
   own (they get the numbers libunwind's pipe had); a new thread's
   exchanges make capsan unwind: libunwind reads a byte out of the
   program's pipe and writes a byte of memory into it;
2. the program closes every descriptor, 0-2 included; a new thread's
   exchanges make libunwind's read fail, so it makes a new pipe, at
   descriptors 0 and 1: the program's next open() is not 0.

Without capsan: "pipes intact", "first descriptor 0". The results go to
OUTFILE (stdout and stderr are closed by then).

argv: OUTFILE
"""
import os
import sys
import threading

import dlconsumer as C
import dlproducer as P

OUT = sys.argv[1]


def work():
    for _ in range(50):
        C.consume_good(P.good(4))


def work_mapped():
    """the same through map(): other native frames, so capsan cannot reuse
    a chain it unwound before and calls libunwind again"""
    list(map(lambda _: C.consume_good(P.good(4)), range(50)))


def in_a_new_thread(fn):
    th = threading.Thread(target=fn)
    th.start()
    th.join()


work()
os.closerange(3, 1 << 20)
pipes = [os.pipe() for _ in range(8)]
for k, (r, w) in enumerate(pipes):
    os.write(w, b"message %d" % k)
in_a_new_thread(work)
damaged = []
for k, (r, w) in enumerate(pipes):
    os.close(w)
    got = os.read(r, 100)
    os.close(r)
    if got != b"message %d" % k:
        damaged.append(f"{r}:{got!r}")

os.closerange(0, 1 << 20)
in_a_new_thread(work_mapped)
fd = os.open(OUT, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
os.write(fd, (f"pipes {'intact' if not damaged else 'damaged ' + ' '.join(damaged)}\n"
              f"first descriptor {fd}\n").encode())
