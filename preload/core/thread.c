/* Per-thread state (see thread.h). */
#include "thread.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "pyapi.h"
#include "spin.h"
#include "stack.h"
#include "tracefile.h"
#include "alloc.h"

__thread cs_thread *cs_thread_tls __attribute__((tls_model("initial-exec")));
__thread unsigned cs_frees __attribute__((tls_model("initial-exec")));
static pthread_key_t key;
static _Atomic uint32_t next_num = 1;
/* every thread state not yet freed (its thread has not exited, or it was
 * a Python thread the interpreter's finalization ended): taken at a
 * thread's first event and at its exit only */
static cs_thread *alive;
static cs_spin alive_mu = CS_SPIN_INIT;

static void unlink_locked(cs_thread *t)
{
    if (t->prev)
        t->prev->next = t->next;
    else if (alive == t)
        alive = t->next;
    if (t->next)
        t->next->prev = t->prev;
    t->next = t->prev = NULL;
}

void (*cs_thread_on_exit)(cs_thread *t);

static void thread_exit(void *p)
{
    cs_thread *t = p;
    if (cs_thread_on_exit)
        cs_thread_on_exit(t);
    /* a Python thread that the interpreter's finalization ended (a daemon
     * thread wanting the GIL back is made to exit) leaves its frames, and
     * what they hold, behind: it stays listed, as holding them. It still
     * has its thread state; one that finished normally deleted its own
     * before its pthread ended (join() may have returned already) */
    int abandoned = t->python && cs_py.ok && !cs_py_live() && cs_py.GILState_GetThisThreadState &&
                    cs_py.GILState_GetThisThreadState() != NULL;
    if (!abandoned) {
        cs_spin_lock(&alive_mu);
        unlink_locked(t);
        cs_spin_unlock(&alive_mu);
    }
    cs_thread_tls = NULL;
    cs_stack_cache_free(t->cache);
    t->cache = NULL;
    if (!abandoned)
        cs_free(t);
}

void cs_thread_init(void)
{
    pthread_key_create(&key, thread_exit);
}

cs_thread *cs_thread_make(void)
{
    cs_thread *t = cs_calloc(1, sizeof *t);
    if (!t)
        return NULL;
    t->num = atomic_fetch_add(&next_num, 1);
    t->pthread = (unsigned long)pthread_self();
    cs_thread_tls = t;
    pthread_setspecific(key, t);
    cs_spin_lock(&alive_mu);
    t->next = alive;
    if (alive)
        alive->prev = t;
    alive = t;
    cs_spin_unlock(&alive_mu);
    return t;
}

size_t cs_thread_python_left(uint32_t *out, size_t max, int (*running)(uint32_t num))
{
    size_t n = 0;
    cs_thread *me = cs_thread_tls;
    cs_spin_lock(&alive_mu);
    for (cs_thread *t = alive; t; t = t->next)
        if (t != me && t->python && (t->stayed || !running || running(t->num))) {
            if (n < max)
                out[n] = t->num;
            n++;
        }
    cs_spin_unlock(&alive_mu);
    return n;
}

uint32_t cs_thread_num_of(unsigned long pthread)
{
    uint32_t num = 0;
    cs_spin_lock(&alive_mu);
    for (cs_thread *t = alive; t && !num; t = t->next)
        if (t->pthread == pthread)
            num = t->num;
    cs_spin_unlock(&alive_mu);
    return num;
}

void cs_thread_fork_lock(int lock)
{
    if (lock)
        cs_spin_lock(&alive_mu);
    else
        cs_spin_unlock(&alive_mu);
}

void cs_thread_fork_child(void)
{
    for (cs_thread *t = alive; t; t = t->next)
        if (t != cs_thread_tls)
            t->stayed = 1;
    cs_spin_unlock(&alive_mu);
}

void cs_thread_write(cs_thread *t)
{
    t->written_gen = cs_trace_gen();
    cs_rec_thread r = {.thread = t->num, .os_tid = (uint64_t)syscall(SYS_gettid)};
    char name[32] = "";
    pthread_getname_np(pthread_self(), name, sizeof name);
    const char *strs[1] = {name};
    cs_trace_write_strs(CS_REC_THREAD, &r, sizeof r, strs, 1);
}
