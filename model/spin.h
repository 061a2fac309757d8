/* A small test-and-set lock for capsan's short critical sections (a table
 * lookup and a record write). Cheaper than a mutex uncontended, which is
 * the common case: most callers already hold the GIL. It yields after a
 * few spins so a preempted holder does not burn the other core. */
#ifndef CAPSAN_SPIN_H
#define CAPSAN_SPIN_H

#include <sched.h>
#include <stdatomic.h>

typedef struct cs_spin {
    atomic_flag f;
} cs_spin;

#define CS_SPIN_INIT {ATOMIC_FLAG_INIT}

static inline void cs_spin_lock(cs_spin *l)
{
    for (unsigned n = 0; atomic_flag_test_and_set_explicit(&l->f, memory_order_acquire); n++) {
        if (n >= 64)
            sched_yield();
        else
            __builtin_ia32_pause();
    }
}

static inline void cs_spin_unlock(cs_spin *l)
{
    atomic_flag_clear_explicit(&l->f, memory_order_release);
}

#endif
