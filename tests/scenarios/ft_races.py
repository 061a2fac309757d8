"""Races a free-threaded build (3.13t) makes possible at capsan's seams,
each committed for real by tests/fixtures/ftrace.c from two Python threads.

    python ft_races.py MODE

double-consume: two threads consume one DLPack capsule at once, both get
    its pointer, both rename it (CPython makes a capsule's fields atomic,
    not a consumer's check-then-rename)
locked-consume: the same with the consumer's fix (a critical section on
    the capsule): one consumes, the other is refused
stream-next: two threads call get_next of one Arrow stream at once
stream-release: one thread releases an Arrow stream while another is in
    its get_next
Prints "gil=False" on a free-threaded build that stayed so, "done" at the end."""
import sys
import threading

import ftrace

mode = sys.argv[1]
print("gil=%s" % (sys._is_gil_enabled() if hasattr(sys, "_is_gil_enabled") else True))
held, errors = [], []


def both(a, b):
    ftrace.race_reset()
    ts = [threading.Thread(target=a), threading.Thread(target=b)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()


if mode == "double-consume":
    import dlproducer
    cap = dlproducer.good(4)  # <-- export

    def first():
        held.append(ftrace.consume(cap, 0))  # <-- consume-first

    def second():
        held.append(ftrace.consume(cap, 1))  # <-- consume-second

    both(first, second)
    del cap
    held.clear()  # both holders call the deleter
elif mode == "locked-consume":
    import dlproducer
    cap = dlproducer.good(4)

    def take():
        try:
            held.append(ftrace.consume_locked(cap))
        except ValueError as e:
            errors.append(str(e))

    both(take, take)
    assert len(held) == 1 and errors == ["capsule already consumed"], (held, errors)
    del cap
    held.clear()
elif mode == "stream-next":
    import arrowfx
    h = ftrace.stream_hold(arrowfx.export_stream(3, 5, "barrier"))  # <-- export-stream

    def read():
        held.append(ftrace.stream_next(h))  # <-- next

    both(read, read)
    assert sorted(held) == [5, 5], held
    del h
elif mode == "stream-release":
    h = ftrace.stream_hold(ftrace.slow_stream())  # <-- export-slow

    def read():
        held.append(ftrace.stream_next(h))  # <-- next-slow

    def close():
        ftrace.stream_release_racing(h)  # <-- release-racing

    both(read, close)
    assert held == [-1], held
    del h
print("done")
