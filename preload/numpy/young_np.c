/* NumPy blocks judged on the thread that made them (young.h), in the
 * per-thread tables (young_core.c) they share with DLPack tensors
 * (young_dl.c).
 *
 * In the lifecycle's table an alloc and its free cost a stripe lock each,
 * an entry, its history, a tombstone and a crash-safe slot put and dropped
 * (about 800 instructions a pair). Here they cost two table writes under
 * the thread's own lock, which no other thread takes but to adopt.
 *
 * Each thread has YOUNG places for live blocks and GONE for freed ones,
 * both by address. A place holds one block: a newer block in a taken
 * place moves the older one to the lifecycle (a long-lived block ends up
 * there), and the latest freed block at an address replaces older ones,
 * as the lifecycle's own entry would. Adopting a freed pair replays its
 * alloc and free into the lifecycle, unless the lifecycle already holds a
 * newer life of that address.
 *
 * Crash safety: each live place has its slot in a LIVE record of the
 * thread's own, written in place (the key last) as livestate.c writes
 * the lifecycle's; a killed process still shows its young blocks.
 *
 * Lock order: the tables' list, a thread's mu, then the lifecycle's
 * stripes. */
#include "young.h"

#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "options.h"
#include "tracefile.h"
#include "young_int.h"
#include "growclean.h"
#include "alloc.h"

static cs_lifecycle *lc; /* the lifecycle the blocks move to */
static int enabled;
/* what exited threads judged here and never adopted */
static _Atomic uint64_t gone_events;
static _Atomic int64_t gone_born, gone_dl_born;




/* y's slots in a new trace file: its live blocks written anew */
static __attribute__((noinline)) cs_live_slot *slots_renew(young *y)
{
    cs_live_slot *s = young_slots_new(&y->gen, &y->slots, YOUNG);
    if (s)
        for (unsigned i = 0; i < YOUNG; i++)
            if (y->blk[i].obj)
                cs_live_fill(&s[i], &y->blk[i], y->blk[i].a);
    return s;
}

/* y's slots in the current trace file */
static inline cs_live_slot *slots_of(young *y)
{
    if (__builtin_expect(y->gen == cs_trace_gen(), 1))
        return y->slots;
    return slots_renew(y);
}

static inline void clear_slot(young *y, unsigned i)
{
    young_slot_clear(y->slots, y->gen, i);
}



/* the live block at place i goes to the lifecycle (y->mu held) */
static void adopt_live(young *y, unsigned i)
{
    cs_event *e = &y->blk[i];
    young_replay(lc, e, 1);
    clear_slot(y, i);
    young_add(&y->live, -1);
    young_add(&y->live_bytes, -(int64_t)e->a);
    young_add(&y->born, -1);
    young_count(&y->events, -1);
    e->obj = 0;
}

/* the freed pair g goes to the lifecycle, unless it holds a newer life of
 * that address (y->mu held) */
static void adopt_gone(young *y, cs_event *g)
{
    young_replay_released(lc, CS_NS_NUMPY, g, 2);
    young_add(&y->born, -1);
    young_count(&y->events, -2);
    g[0].obj = 0;
}


int cs_young_alloc(cs_thread *t, cs_event *ev)
{
    if (!enabled)
        return 0;
    young *y = cs_young_of(t);
    if (!y)
        return 0;
    cs_spin_lock(&y->mu);
    unsigned i = young_place(ev->obj, YOUNG_BITS);
    cs_event *e = &y->blk[i];
    if (e->obj == ev->obj && e->c && ev->c && e->c != ev->c) {
        /* another handler's block at the same address: a piece carved
         * out of the live one (an arena's first). The table keeps both */
        adopt_live(y, i);
        cs_spin_unlock(&y->mu);
        return 0;
    } else if (e->obj == ev->obj) {
        /* tracked again without a free (numpy's realloc in place): the
         * old block is gone, as the lifecycle says of a missed free */
        young_add(&y->live, -1);
        young_add(&y->live_bytes, -(int64_t)e->a);
    } else if (atomic_load_explicit(&cs_lc_np_live[cs_lc_np_live_at(ev->obj)],
                                    memory_order_relaxed)) {
        /* the table may hold a live block there (a long-lived one moved
         * to it, reallocated in place): the table judges */
        cs_spin_unlock(&y->mu);
        return 0;
    } else if (e->obj) { /* an older block in its place */
        adopt_live(y, i);
    }
    ev->time_ns = cs_now_ns();
    *e = *ev;
    cs_live_slot *s = slots_of(y);
    if (s)
        cs_live_fill(&s[i], e, e->a);
    young_add(&y->live, 1);
    young_add(&y->live_bytes, (int64_t)ev->a);
    young_add(&y->born, 1);
    young_count(&y->events, 1);
    cs_spin_unlock(&y->mu);
    return 1;
}

/* inlined into numpy's Untrack hook with its emit (-flto) */
__attribute__((always_inline)) inline int cs_young_free(cs_thread *t, cs_event *ev)
{
    young *y = t->young;
    if (!y)
        return 0;
    cs_spin_lock(&y->mu);
    unsigned i = young_place(ev->obj, YOUNG_BITS);
    cs_event *e = &y->blk[i];
    if (e->obj != ev->obj || cs_np_free_stale(e, ev)) {
        cs_spin_unlock(&y->mu);
        return 0;
    }
    ev->time_ns = cs_now_ns();
    cs_event *g = y->gone[young_place(ev->obj, GONE_BITS)];
    g[0] = *e;
    g[1] = *ev;
    clear_slot(y, i);
    e->obj = 0;
    young_add(&y->live, -1);
    young_add(&y->live_bytes, -(int64_t)g[0].a);
    young_count(&y->events, 1);
    cs_spin_unlock(&y->mu);
    return 1;
}

typedef struct wanted {
    uint64_t key;
    int live;          /* found live (and adopted) */
    const young *best; /* else: the thread with its latest freed life */
    uint64_t best_t;
} wanted;

static void look(young *y, void *ud)
{
    wanted *f = ud;
    unsigned i = young_place(f->key, YOUNG_BITS), k = young_place(f->key, GONE_BITS);
    if (f->live)
        return;
    if (y->blk[i].obj == f->key) { /* a live block: its latest life */
        adopt_live(y, i);
        f->live = 1;
    } else if (y->gone[k][0].obj == f->key && (!f->best || y->gone[k][1].time_ns >= f->best_t)) {
        f->best = y;
        f->best_t = y->gone[k][1].time_ns;
    }
}

static void take_best(young *y, void *ud)
{
    wanted *f = ud;
    unsigned k = young_place(f->key, GONE_BITS);
    if (y == f->best && y->gone[k][0].obj == f->key)
        adopt_gone(y, y->gone[k]);
}

void cs_young_adopt(uint64_t key)
{
    if (!enabled || !key || !young_listed())
        return;
    wanted f = {.key = key};
    young_each(look, &f);
    if (!f.live && f.best)
        young_each(take_best, &f);
}

static void flush_locked(young *y)
{
    for (unsigned i = 0; i < YOUNG; i++)
        if (y->blk[i].obj)
            adopt_live(y, i);
    cs_young_dl_flush_locked(y, 0);
}

static void flush_one(young *y, void *ud)
{
    (void)ud;
    flush_locked(y);
}

void cs_young_flush(void)
{
    if (enabled)
        young_each(flush_one, NULL);
}

typedef struct touched {
    uint64_t since_ns;
    size_t n;
} touched;

static void count_touched(young *y, void *ud)
{
    touched *c = ud;
    for (unsigned i = 0; i < YOUNG; i++)
        if (y->blk[i].obj && y->blk[i].time_ns >= c->since_ns)
            c->n++;
    c->n += cs_young_dl_touched_locked(y, c->since_ns);
}

size_t cs_young_touched_since(uint64_t since_ns)
{
    touched c = {since_ns, 0};
    if (enabled)
        young_each(count_touched, &c);
    return c.n;
}



/* A thread's end: its live blocks outlive it (in the lifecycle), and so
 * do its freed ones (a later second free of one is still a double free) */
static void retire(young *y)
{
    flush_locked(y);
    for (unsigned k = 0; k < GONE; k++)
        if (y->gone[k][0].obj)
            adopt_gone(y, y->gone[k]);
    cs_young_dl_flush_locked(y, 1);
    atomic_fetch_add(&gone_events, y->events + y->dl.events);
    atomic_fetch_add(&gone_born, y->born);
    atomic_fetch_add(&gone_dl_born, y->dl.born);
}

static void thread_gone(cs_thread *t)
{
    young *y = t->young;
    if (!y)
        return;
    young_remove(y, retire);
    t->young = NULL;
    /* freed memory keeps its bytes: the addresses in it would pass for
     * references to the objects just adopted in the leak scan at exit */
    cs_free_clean(y, sizeof *y);
}

/* the lifecycle's totals and event count, with what is judged here. Also
 * from a crash handler: a lock another thread holds is not waited for */
typedef struct sums {
    cs_lc_totals *add;
    uint64_t *events;
} sums;

static void add_one(young *y, void *ud)
{
    sums *u = ud;
    u->add->numpy += __atomic_load_n(&y->live, __ATOMIC_RELAXED);
    u->add->numpy_bytes += __atomic_load_n(&y->live_bytes, __ATOMIC_RELAXED);
    u->add->born_numpy += __atomic_load_n(&y->born, __ATOMIC_RELAXED);
    *u->events += __atomic_load_n(&y->events, __ATOMIC_RELAXED);
    cs_young_dl_totals(y, u->add, u->events);
}

static void outside(cs_lc_totals *add_to, uint64_t *events)
{
    *events += atomic_load(&gone_events);
    add_to->born_numpy += atomic_load(&gone_born);
    add_to->born_dlpack += atomic_load(&gone_dl_born);
    sums u = {add_to, events};
    young_each_unlocked(add_one, &u);
}

void cs_young_init(cs_lifecycle *to)
{
    if (cs_opt.record_all || !to)
        return;
    lc = to;
    if (!(cs_lc_np_live = cs_calloc((size_t)1 << CS_LC_NP_LIVE_BITS, sizeof *cs_lc_np_live)) ||
        !cs_young_dl_init(to))
        return;
    cs_lc_outside = outside;
    cs_thread_on_exit = thread_gone;
    enabled = 1;
}
