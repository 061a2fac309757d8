"""Shared by the stress programs.

watchdog(): when CAPSAN_STRESS_WATCHDOG=SECONDS is set, a program that has
not finished by then (a deadlock, in capsan or anywhere) prints every
thread's Python stack on stderr and exits with status 1 (faulthandler:
its thread needs no GIL), so a hang fails the test with evidence instead
of stalling it.

fork(): os.fork() with the watchdog stopped around it and armed again on
both sides for the time left. faulthandler's watchdog thread does not
survive a fork, and a child that then exits normally waits for it
forever (faulthandler_unload joins it).

run_threads(): start threads on (target, args) pairs, then join them all.

Turns: exactly N turns at a true bug, taken by whichever thread asks
first; what the threads leave is taken at the end (rest(), or finish()
with the function that commits each bug).
"""
import faulthandler
import os
import threading
import time

_deadline = None


def _arm():
    faulthandler.dump_traceback_later(max(1.0, _deadline - time.monotonic()), exit=True)


def watchdog():
    global _deadline
    secs = float(os.environ.get("CAPSAN_STRESS_WATCHDOG", "0") or 0)
    if secs > 0:
        _deadline = time.monotonic() + secs
        _arm()


def fork():
    if _deadline is not None:
        faulthandler.cancel_dump_traceback_later()
    pid = os.fork()
    if _deadline is not None:
        _arm()
    return pid


def run_threads(jobs):
    ths = [threading.Thread(target=target, args=args) for target, args in jobs]
    for th in ths:
        th.start()
    for th in ths:
        th.join()


class Turns:
    def __init__(self, **counts):
        self._left = dict(counts)
        self._lock = threading.Lock()

    def take(self, what):
        with self._lock:
            if self._left[what] > 0:
                self._left[what] -= 1
                return True
        return False

    def rest(self, what):
        with self._lock:
            n, self._left[what] = self._left[what], 0
        return n

    def finish(self, **bugs):
        """Commit the turns the threads did not take (a tiny ITER)."""
        for what, commit in bugs.items():
            for _ in range(self.rest(what)):
                commit()
