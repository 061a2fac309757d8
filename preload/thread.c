/* Per-thread state (see thread.h). */
#include "thread.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "stack.h"
#include "tracefile.h"

__thread cs_thread *cs_thread_tls __attribute__((tls_model("initial-exec")));
__thread unsigned cs_frees __attribute__((tls_model("initial-exec")));
static pthread_key_t key;
static _Atomic uint32_t next_num = 1;

static void thread_exit(void *p)
{
    cs_thread *t = p;
    cs_thread_tls = NULL;
    cs_stack_cache_free(t->cache);
    free(t);
}

void cs_thread_init(void)
{
    pthread_key_create(&key, thread_exit);
}

cs_thread *cs_thread_make(void)
{
    cs_thread *t = calloc(1, sizeof *t);
    if (!t)
        return NULL;
    t->num = atomic_fetch_add(&next_num, 1);
    cs_thread_tls = t;
    pthread_setspecific(key, t);
    return t;
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
