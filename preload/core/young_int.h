/* The per-thread tables of young.c (NumPy blocks) and young_dl.c (DLPack
 * tensors), one struct per thread under one lock. Private to those two
 * files. Lock order: young.c's all_mu, a thread's mu, then the lifecycle's
 * stripes. */
#ifndef CAPSAN_YOUNG_INT_H
#define CAPSAN_YOUNG_INT_H

#include <stdint.h>

#include "lifecycle.h"
#include "livestate.h"
#include "spin.h"
#include "thread.h"
#include "tracefile.h"
#include "tracefmt.h"

#define YOUNG_BITS 7
#define YOUNG (1u << YOUNG_BITS) /* live blocks a thread keeps */
#define GONE_BITS 10
#define GONE (1u << GONE_BITS) /* freed blocks a thread remembers */
#define DLY_BITS 6
#define DLY (1u << DLY_BITS) /* live tensors a thread keeps */
#define DLG_BITS 8
#define DLG (1u << DLG_BITS) /* released tensors a thread remembers */

/* a thread's DLPack tensors (young_dl.c) */
typedef struct dl_young {
    uint32_t gen;        /* the trace generation `slots` lie in */
    cs_live_slot *slots; /* DLY crash-safe slots, place by place, or NULL */
    int64_t live, live_bytes, born;
    uint64_t events;
    cs_event ev[DLY][2];   /* each live tensor's export (or birth) and consume
                            * ([0].obj 0: a free place) */
    uint8_t nev[DLY];      /* its events */
    uint8_t consumed[DLY]; /* consumed (an exchange-API birth: from birth) */
    uint8_t xapi[DLY];     /* born through the exchange API: no capsule */
    uint64_t data[DLY];    /* the data it watches (dataguard.c), or 0 */
    cs_event gone[DLG][3]; /* the latest released tensor at each place: its events */
    uint8_t gone_n[DLG];   /* how many (the last its delete), 0: none */
} dl_young;

typedef struct cs_young {
    cs_spin mu;
    uint32_t gen;        /* the trace generation `slots` lie in */
    cs_live_slot *slots; /* YOUNG crash-safe slots, place by place, or NULL */
    /* judged here and not adopted: written under mu, read relaxed */
    int64_t live, live_bytes, born;
    uint64_t events;
    struct cs_young *next, *prev;
    cs_event blk[YOUNG];    /* each live block's alloc (obj 0: a free place) */
    cs_event gone[GONE][2]; /* the latest freed block at each place: alloc, free */
    dl_young dl;
} young;

/* the thread's tables, made at its first young object (NULL: no memory) */
young *cs_young_of(cs_thread *t);
/* fn on every thread's tables, each under its lock (all_mu held) */
void young_each(void (*fn)(young *y, void *ud), void *ud);
/* any thread has tables (a relaxed read) */
int young_listed(void);
/* the same, without the tables' locks and giving up on a list lock held
 * too long (a crash handler's totals) */
void young_each_unlocked(void (*fn)(young *y, void *ud), void *ud);
/* y leaves the list, retire(y) run first with the list's and y's locks */
void young_remove(young *y, void (*retire)(young *y));

static inline unsigned young_place(uint64_t p, unsigned bits)
{
    return (unsigned)(((p >> 4) * 0x9e3779b97f4a7c15ull) >> (64 - bits));
}

static inline void young_add(int64_t *v, int64_t d)
{
    __atomic_store_n(v, *v + d, __ATOMIC_RELAXED);
}

static inline void young_count(uint64_t *events, int64_t d)
{
    __atomic_store_n(events, *events + (uint64_t)d, __ATOMIC_RELAXED);
}

/* e[0..n) judged by the lifecycle `to` now, as they came (one life's
 * events, under its stripe's lock) */
void young_replay(cs_lifecycle *to, const cs_event *e, int n);
/* The same for a released life (e[n-1] its release), unless `to` holds a
 * newer life of that address; it takes no crash-safe slot (livestate.h) */
void young_replay_released(cs_lifecycle *to, int ns, const cs_event *e, int n);
/* n slots of a LIVE record of the thread's own in a trace file newer than
 * generation *gen (a forked child's file is another): *gen, *slots set */
/* place i's crash-safe slot cleared, if its slots are the current trace
 * file's (gen): its object left the table */
static inline void young_slot_clear(cs_live_slot *slots, uint32_t gen, unsigned i)
{
    if (slots && gen == cs_trace_gen())
        atomic_store_explicit((_Atomic uint64_t *)&slots[i].obj, 0, memory_order_release);
}
cs_live_slot *young_slots_new(uint32_t *gen, cs_live_slot **slots, uint32_t n);

/* young_dl.c's part of what young.c does for every thread (y->mu held):
 * its live tensors to the lifecycle (and its released ones: `all`) */
void cs_young_dl_flush_locked(young *y, int all);
/* its live and born tensors and events, for cs_lc_outside */
void cs_young_dl_totals(const young *y, cs_lc_totals *add, uint64_t *events);
/* its live tensors whose latest event came at or after since_ns (y->mu held) */
size_t cs_young_dl_touched_locked(const young *y, uint64_t since_ns);
/* set up with the rest (young.c's init): 0 if it cannot be */
int cs_young_dl_init(cs_lifecycle *to);

#endif
