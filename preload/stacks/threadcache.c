/* The per-thread cache (stack_int.h's cs_stack_cache): made at a thread's
 * first capture, with the bounds of its stack that the chain cache reads
 * within, and freed with the thread (thread.c). */
#include "stack_int.h"

#include <pthread.h>
#include <stdlib.h>

#include "alloc.h"

void cs_stack_cache_free(cs_stack_cache *c)
{
    if (!c)
        return;
    for (size_t i = 0; i < sizeof c->memofr / sizeof c->memofr[0]; i++)
        cs_free(c->memofr[i]);
    for (int i = 0; i < PYMEMO; i++)
        cs_free(c->pyfr[i]);
    cs_free(c);
}

static void thread_stack(cs_stack_cache *c)
{
    pthread_attr_t a;
    void *lo;
    size_t sz;
    c->stack_lo = c->stack_hi = 0;
    if (pthread_getattr_np(pthread_self(), &a) == 0) {
        if (pthread_attr_getstack(&a, &lo, &sz) == 0) {
            c->stack_lo = (uintptr_t)lo;
            c->stack_hi = (uintptr_t)lo + sz;
        }
        pthread_attr_destroy(&a);
    }
}

/* apart from cache_of, which then inlines into every capture: with this
 * inside it, each call set up this frame (a pthread_attr_t), 36
 * instructions an event */
static __attribute__((noinline)) cs_stack_cache *cache_new(cs_thread *t)
{
    if (!(t->cache = cs_calloc(1, sizeof *t->cache)))
        return NULL;
    thread_stack(t->cache); /* stays 0..0 when unknown: no fast path */
    t->cache->learn_credit = LEARN_MAX;
    return t->cache;
}

cs_stack_cache *cache_of(cs_thread *t)
{
    return __builtin_expect(t->cache != NULL, 1) ? t->cache : cache_new(t);
}

int cs_stack_holds(const cs_thread *t, const void *p)
{
    if (!t || !t->cache || !t->cache->stack_hi)
        return -1;
    return (uintptr_t)p - t->cache->stack_lo < t->cache->stack_hi - t->cache->stack_lo;
}
