/* The per-thread tables (young_int.h): their list, and what NumPy's
 * blocks (young.c) and DLPack's tensors (young_dl.c) both do with them.
 * Below both, so that neither reaches the other through it.
 *
 * Lock order: all_mu, a thread's mu, then the lifecycle's stripes. */
#include "young_int.h"

#include <stdatomic.h>
#include <stdlib.h>

#include "tracefile.h"
#include "alloc.h"

static young *all;
static cs_spin all_mu = CS_SPIN_INIT;

int young_listed(void)
{
    return atomic_load_explicit((_Atomic(young *) *)&all, memory_order_relaxed) != NULL;
}

void young_each(void (*fn)(young *y, void *ud), void *ud)
{
    if (!atomic_load_explicit((_Atomic(young *) *)&all, memory_order_relaxed))
        return;
    cs_spin_lock(&all_mu);
    for (young *y = all; y; y = y->next) {
        cs_spin_lock(&y->mu);
        fn(y, ud);
        cs_spin_unlock(&y->mu);
    }
    cs_spin_unlock(&all_mu);
}

/* fn(y) for each table without its lock, and without waiting long for the
 * list's: from a crash handler, a lock another thread holds is given up */
void young_each_unlocked(void (*fn)(young *y, void *ud), void *ud)
{
    int spins = 0;
    while (atomic_flag_test_and_set_explicit(&all_mu.f, memory_order_acquire))
        if (++spins > 100000)
            return;
    for (young *y = all; y; y = y->next)
        fn(y, ud);
    cs_spin_unlock(&all_mu);
}

young *cs_young_of(cs_thread *t)
{
    if (t->young)
        return t->young;
    young *y = cs_calloc(1, sizeof *y);
    if (!y)
        return NULL;
    cs_spin_lock(&all_mu);
    y->next = all;
    if (all)
        all->prev = y;
    all = y;
    cs_spin_unlock(&all_mu);
    t->young = y;
    return y;
}

void young_remove(young *y, void (*retire)(young *y))
{
    cs_spin_lock(&all_mu);
    cs_spin_lock(&y->mu);
    retire(y);
    if (y->prev)
        y->prev->next = y->next;
    else
        all = y->next;
    if (y->next)
        y->next->prev = y->prev;
    cs_spin_unlock(&y->mu);
    cs_spin_unlock(&all_mu);
}

cs_live_slot *young_slots_new(uint32_t *gen, cs_live_slot **slots, uint32_t n)
{
    if (!cs_trace_started())
        return NULL;
    *slots = cs_live_block(n);
    *gen = cs_trace_gen();
    return *slots;
}

void young_replay(cs_lifecycle *to, const cs_event *e, int n)
{
    cs_lc_lock(to, e[0].obj);
    for (int k = 0; k < n; k++)
        cs_lc_event(to, &e[k]);
    cs_lc_unlock(to, e[0].obj);
}

void young_replay_released(cs_lifecycle *to, int ns, const cs_event *e, int n)
{
    cs_event origin;
    cs_lc_lock(to, e[0].obj);
    if (!(cs_lc_origin(to, ns, e[0].obj, &origin) && origin.time_ns > e[n - 1].time_ns)) {
        cs_live_replaying = 1; /* dead: no crash-safe slot */
        for (int k = 0; k < n; k++)
            cs_lc_event(to, &e[k]);
        cs_live_replaying = 0;
    }
    cs_lc_unlock(to, e[0].obj);
}

void cs_young_fork_lock(int lock)
{
    if (lock) {
        cs_spin_lock(&all_mu);
        for (young *y = all; y; y = y->next)
            cs_spin_lock(&y->mu);
    } else {
        for (young *y = all; y; y = y->next)
            cs_spin_unlock(&y->mu);
        cs_spin_unlock(&all_mu);
    }
}

void cs_young_own_memory(void (*fn)(void *ud, const void *p, size_t n), void *ud)
{
    cs_spin_lock(&all_mu);
    for (young *y = all; y; y = y->next)
        fn(ud, y, sizeof *y);
    cs_spin_unlock(&all_mu);
}
