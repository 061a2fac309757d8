/* Does this thread hold the GIL? (see pyapi.h: cs_gil_held)
 *
 * PyGILState_Check() asks thread-specific storage for this thread's
 * PyThreadState (pthread_getspecific) on every call, and capsan asks on
 * every hook. In 3.11 the thread holding the GIL is the one whose
 * PyThreadState is current, and a PyThreadState records the thread that
 * made it (thread_id, pthread_self()): comparing the two needs no TSS. A
 * thread's first checks are made both ways; one disagreement turns the
 * shortcut off for the process. */
#define Py_BUILD_CORE 1
#include <Python.h>

#include "pyapi.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>

#include "options.h"

static _Atomic int fast = -1; /* -1: not decided yet, 0: PyGILState_Check */
static __thread unsigned checked __attribute__((tls_model("initial-exec")));
#define CHECKS_PER_THREAD 32

static int held_311(void)
{
    const PyThreadState *ts = cs_py.ThreadState_UncheckedGet();
    return ts && ts->thread_id == (unsigned long)pthread_self();
}

int cs_gil_held(void)
{
    int f = atomic_load_explicit(&fast, memory_order_relaxed);
    if (f < 0) {
        f = cs_py.frames_311 && cs_py.ThreadState_UncheckedGet;
        atomic_store(&fast, f);
    }
    if (!f)
        return cs_py.GILState_Check();
    if (checked < CHECKS_PER_THREAD) {
        checked++;
        int a = held_311(), b = cs_py.GILState_Check();
        if (a != b) {
            atomic_store(&fast, 0);
            if (cs_opt.verbosity)
                dprintf(2, "capsan: GIL check shortcut disagrees with PyGILState_Check; off\n");
            return b;
        }
        return a;
    }
    return held_311();
}
