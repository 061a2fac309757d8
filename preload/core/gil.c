/* Does this thread hold the GIL? Is the interpreter running? (pyapi.h)
 *
 * Both questions are asked on every hook. PyGILState_Check() looks this
 * thread's PyThreadState up in thread-specific storage, and both answers
 * cost a call into libpython. In 3.10 and 3.11 the thread holding the GIL
 * is the one whose PyThreadState is current
 * (_PyRuntime.gilstate.tstate_current), a PyThreadState records the thread
 * that made it (thread_id, pthread_self()), and Py_IsInitialized() is
 * _PyRuntime.initialized: three loads, inlined in pyapi.h, at the offsets
 * of pyversions.inc. Since 3.12 the current thread state is a C
 * thread-local that no symbol reaches: those versions ask libpython. A
 * thread's first checks are made both ways; one disagreement turns the
 * shortcut off for the process. */
#include "pyapi.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stddef.h>
#include <stdatomic.h>
#include <stdio.h>

#include "options.h"

cs_pyfast cs_pyf;
__thread unsigned cs_gil_checks __attribute__((tls_model("initial-exec")));

static _Atomic int decided;

/* Point cs_pyf at _PyRuntime if its layout is the one compiled in. */
static void decide(void)
{
    if (atomic_exchange(&decided, 1))
        return;
    const cs_pylayout *l = cs_py.layout;
    char *rt = l && l->rt_tstate >= 0 ? dlsym(RTLD_DEFAULT, "_PyRuntime") : NULL;
    if (!rt)
        return;
    void *const volatile *ts = (void *const volatile *)(rt + l->rt_tstate);
    const volatile int *init = (const volatile int *)(rt + l->rt_initialized);
    if (*ts != cs_py.ThreadState_UncheckedGet() || *init != cs_py.IsInitialized())
        return;
    cs_pyf.tid_off = (size_t)l->ts_thread_id;
    cs_pyf.initialized = init;
    __atomic_store_n(&cs_pyf.tstate, ts, __ATOMIC_RELEASE);
}

static void disagree(const char *what)
{
    __atomic_store_n(&cs_pyf.tstate, NULL, __ATOMIC_RELEASE);
    cs_pyf.initialized = NULL;
    if (cs_opt.verbosity)
        dprintf(2, "capsan: %s shortcut disagrees with libpython; off\n", what);
}

int cs_gil_held_slow(void)
{
    if (!atomic_load_explicit(&decided, memory_order_relaxed))
        decide();
    if (!__atomic_load_n(&cs_pyf.tstate, __ATOMIC_ACQUIRE))
        return cs_py.GILState_Check();
    int b = cs_py.GILState_Check();
    if ((unsigned long)__builtin_thread_pointer() != (unsigned long)pthread_self()) {
        disagree("thread pointer");
        return b;
    }
    if (cs_pyf.initialized && *cs_pyf.initialized != cs_py.IsInitialized()) {
        disagree("Py_IsInitialized");
        return b;
    }
    const char *ts = cs_py.ThreadState_UncheckedGet();
    int a = ts && *(const unsigned long *)(ts + cs_pyf.tid_off) == (unsigned long)pthread_self();
    if (a != b) {
        disagree("GIL check");
        return b;
    }
    cs_gil_checks++;
    return a;
}
