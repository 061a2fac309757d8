/* DLPack tensors judged on the thread that exported them (young.h).
 *
 * An exchange exports, consumes and deletes a tensor on one thread,
 * microseconds apart. In the lifecycle's table each of the three costs a
 * stripe lock, the rule's dispatch, an entry with its history, a
 * crash-safe slot, and at the end a tombstone (about 1,000 instructions
 * an exchange). Here the clean path costs three writes to the thread's
 * own table, under its own lock:
 *
 *   export in a capsule, or birth through the exchange API of a tensor
 *           its caller owns (consumed from birth), with a deleter, at an
 *           address no live tensor holds: a live place;
 *   consume by the capsule it was exported in, under the right name and
 *           with byte_offset honoured: the place says so, its data is
 *           watched (dataguard.c) and its slot marked consumed;
 *   delete, consumed and not by its own capsule's destructor, or
 *           unconsumed and by it: the three events retire to the released
 *           place at its address, where a second delete finds them.
 *
 * Anything else about such a tensor (another rule's event, a lookup, an
 * event on another thread) first moves it into the lifecycle, which then
 * judges it as if it had been there all along: its events are replayed
 * (cs_young_dl_adopt). A newer tensor at a taken place moves the older
 * one there, so long-lived tensors end up in the lifecycle. */
#include "young.h"

#include <stdatomic.h>
#include <stdlib.h>

#include "tracefile.h"
#include "young_int.h"
#include "alloc.h"

static cs_lifecycle *lc; /* the lifecycle tensors move to */
static int enabled;
/* by cs_lc_np_live_at of the key: live tensors here (an export at such an
 * address goes to the lifecycle), and tensors live or released here (any
 * other event about one adopts it) */
static _Atomic uint16_t *ylive;
_Atomic uint16_t *cs_young_dl_held;

static inline void bump(_Atomic uint16_t *c, uint64_t key, int d)
{
    atomic_fetch_add_explicit(&c[cs_lc_np_live_at(key)], (uint16_t)d, memory_order_relaxed);
}

/* d's slots in a new trace file: its live tensors written anew */
static __attribute__((noinline)) cs_live_slot *slots_renew(dl_young *d)
{
    cs_live_slot *s = young_slots_new(&d->gen, &d->slots, DLY);
    if (s)
        for (unsigned i = 0; i < DLY; i++)
            if (d->ev[i][0].obj) {
                cs_live_fill(&s[i], &d->ev[i][0], d->ev[i][0].c);
                if (d->consumed[i])
                    s[i].consume_stack = d->ev[i][d->nev[i] - 1].stack;
            }
    return s;
}

/* d's slots in the current trace file */
static inline cs_live_slot *slots_of(dl_young *d)
{
    if (__builtin_expect(d->gen == cs_trace_gen(), 1))
        return d->slots;
    return slots_renew(d);
}

static inline void clear_slot(dl_young *d, unsigned i)
{
    young_slot_clear(d->slots, d->gen, i);
}

/* a consumed tensor's data watch (dataguard.c), as the lifecycle keeps it */
static inline void watch(dl_young *d, unsigned i, int sign)
{
    if (d->data[i] && cs_lc_data_watch)
        cs_lc_data_watch(d->ev[i][0].obj, d->data[i], d->ev[i][0].c, sign);
}

/* the live tensor at place i goes to the lifecycle (y->mu held) */
static void adopt_live(dl_young *d, unsigned i)
{
    cs_event e[2] = {d->ev[i][0], d->ev[i][1]};
    int n = d->nev[i];
    watch(d, i, -1); /* the lifecycle watches it again as it judges */
    clear_slot(d, i);
    d->ev[i][0].obj = 0;
    young_add(&d->live, -1);
    young_add(&d->live_bytes, -(int64_t)e[0].c);
    young_add(&d->born, -1);
    young_count(&d->events, -n);
    bump(ylive, e[0].obj, -1);
    bump(cs_young_dl_held, e[0].obj, -1);
    young_replay(lc, e, n);
}

/* the released tensor at place k goes to the lifecycle, unless it holds a
 * newer life of that address (y->mu held) */
static void adopt_gone(dl_young *d, unsigned k)
{
    cs_event *g = d->gone[k];
    int n = d->gone_n[k];
    d->gone_n[k] = 0;
    young_add(&d->born, -1);
    young_count(&d->events, -n);
    bump(cs_young_dl_held, g[0].obj, -1);
    young_replay_released(lc, CS_NS_DLPACK, g, n);
}

static inline int held_live(uint64_t key)
{
    return atomic_load_explicit(&ylive[cs_lc_np_live_at(key)], memory_order_relaxed) != 0;
}

/* A tensor at `key` is alive in the lifecycle. Its filter counts by a hash
 * of the address: with 10,000 tensors alive there a seventh of its slots
 * count, and every export landing on one would go the lifecycle's slower
 * way; the table's own answer costs a lookup instead. */
static int lc_live(uint64_t key)
{
    if (!atomic_load_explicit(&cs_lc_dl_live[cs_lc_np_live_at(key)], memory_order_relaxed))
        return 0;
    cs_lc_lock(lc, key);
    int st = cs_lc_state(lc, CS_NS_DLPACK, key);
    cs_lc_unlock(lc, key);
    return st == CS_ST_CREATED || st == CS_ST_CONSUMED;
}

/* An export in a capsule, or a birth through the exchange API that hands
 * its caller an owning tensor (from_py; to_py's, taken): consumed from
 * birth, its data at ev->a (proto_xapi.c). Views, NULL deleters and a
 * live struct's second export are the lifecycle's. */
static int take_export(cs_thread *t, cs_event *ev)
{
    int x = (ev->aux & CS_DLV_X) != 0;
    if ((x && ((ev->aux & CS_DLV_XVIEW) ||
               ((ev->aux & CS_DLV_XTO) && !(ev->aux & CS_DLV_HANDED)))) ||
        (ev->flags & CS_EVF_NULL_DELETER) ||
        lc_live(ev->obj) || held_live(ev->obj))
        return 0;
    young *y = cs_young_of(t);
    if (!y)
        return 0;
    dl_young *d = &y->dl;
    cs_spin_lock(&y->mu);
    unsigned i = young_place(ev->obj, DLY_BITS);
    if (d->ev[i][0].obj) /* an older tensor in its place */
        adopt_live(d, i);
    ev->time_ns = cs_now_ns();
    d->ev[i][0] = *ev;
    d->nev[i] = 1;
    d->consumed[i] = (uint8_t)x;
    d->xapi[i] = (uint8_t)x;
    d->data[i] = x ? ev->a : 0;
    watch(d, i, 1);
    cs_live_slot *s = slots_of(d);
    if (s) {
        cs_live_fill(&s[i], ev, ev->c);
        if (x)
            s[i].consume_stack = ev->stack;
    }
    young_add(&d->live, 1);
    young_add(&d->live_bytes, (int64_t)ev->c);
    young_add(&d->born, 1);
    young_count(&d->events, 1);
    bump(ylive, ev->obj, 1);
    bump(cs_young_dl_held, ev->obj, 1);
    cs_spin_unlock(&y->mu);
    return 1;
}

/* a consume by the capsule it was exported in, under the right name, with
 * byte_offset honoured */
static int take_consume(young *y, cs_event *ev, cs_event *origin, int *found)
{
    if ((ev->aux & CS_CONSUME_WRONG_NAME) || (ev->flags & CS_EVF_OFFSET_IGNORED) ||
        !held_live(ev->obj))
        return 0;
    dl_young *d = &y->dl;
    cs_spin_lock(&y->mu);
    unsigned i = young_place(ev->obj, DLY_BITS);
    cs_event *e = d->ev[i];
    if (e[0].obj != ev->obj || d->consumed[i] || e[0].a != ev->a) {
        cs_spin_unlock(&y->mu);
        return 0;
    }
    ev->time_ns = cs_now_ns();
    e[1] = *ev;
    d->nev[i] = 2;
    d->consumed[i] = 1;
    d->data[i] = ev->c;
    watch(d, i, 1);
    cs_live_slot *s = slots_of(d);
    if (s)
        s[i].consume_stack = ev->stack;
    young_count(&d->events, 1);
    if (found) {
        *found = 1;
        *origin = e[0];
    }
    cs_spin_unlock(&y->mu);
    return 1;
}

/* a delete of a consumed tensor by its owner, or of an unconsumed one by
 * its own capsule's destructor: the tensor's events retire together */
static int take_delete(young *y, cs_event *ev, cs_event *origin, int *found)
{
    if (ev->aux == CS_DELETE_NULL_CALL || !held_live(ev->obj))
        return 0;
    dl_young *d = &y->dl;
    cs_spin_lock(&y->mu);
    unsigned i = young_place(ev->obj, DLY_BITS);
    cs_event *e = d->ev[i];
    int consumed = d->consumed[i];
    int own_dtor = !d->xapi[i] && (ev->flags & CS_EVF_IN_DTOR) && ev->a == e[0].a;
    /* consumed and its own capsule's destructor deletes it (R3), or
     * unconsumed and anyone else does (R8): the lifecycle's rules */
    if (e[0].obj != ev->obj || consumed == own_dtor) {
        cs_spin_unlock(&y->mu);
        return 0;
    }
    ev->time_ns = cs_now_ns();
    if (found) {
        *found = 1;
        *origin = e[0];
    }
    watch(d, i, -1);
    unsigned k = young_place(ev->obj, DLG_BITS);
    cs_event *g = d->gone[k];
    if (d->gone_n[k]) /* the older released tensor there is forgotten, as
                       * the lifecycle's FIFO forgets a tombstone */
        bump(cs_young_dl_held, g[0].obj, -1);
    int n = d->nev[i];
    for (int k2 = 0; k2 < n; k2++)
        g[k2] = e[k2];
    g[n] = *ev;
    d->gone_n[k] = (uint8_t)(n + 1);
    clear_slot(d, i);
    e[0].obj = 0;
    young_add(&d->live, -1);
    young_add(&d->live_bytes, -(int64_t)g[0].c);
    young_count(&d->events, 1);
    bump(ylive, ev->obj, -1);
    cs_spin_unlock(&y->mu);
    return 1;
}

int cs_young_dl(cs_thread *t, cs_event *ev, cs_event *origin, int *found)
{
    if (!enabled || (ev->flags & CS_EVF_NO_PYTHON))
        return 0;
    switch (ev->kind) {
    case CS_EV_EXPORT:
        return take_export(t, ev);
    case CS_EV_CONSUME:
        return t->young && take_consume(t->young, ev, origin, found);
    case CS_EV_DELETE:
        return t->young && take_delete(t->young, ev, origin, found);
    }
    return 0;
}

/* ---- moving tensors to the lifecycle ---- */

typedef struct wanted {
    uint64_t key;
    int live;          /* found live (and adopted) */
    const young *best; /* else: the thread with its latest released life */
    uint64_t best_t;
} wanted;

static void look(young *y, void *ud)
{
    wanted *f = ud;
    dl_young *d = &y->dl;
    unsigned i = young_place(f->key, DLY_BITS), k = young_place(f->key, DLG_BITS);
    if (f->live)
        return;
    if (d->ev[i][0].obj == f->key) { /* a live tensor: its latest life */
        adopt_live(d, i);
        f->live = 1;
    } else if (d->gone_n[k] && d->gone[k][0].obj == f->key &&
               (!f->best || d->gone[k][d->gone_n[k] - 1].time_ns >= f->best_t)) {
        f->best = y;
        f->best_t = d->gone[k][d->gone_n[k] - 1].time_ns;
    }
}

static void take_best(young *y, void *ud)
{
    wanted *f = ud;
    unsigned k = young_place(f->key, DLG_BITS);
    if (y == f->best && y->dl.gone_n[k] && y->dl.gone[k][0].obj == f->key)
        adopt_gone(&y->dl, k);
}

void cs_young_dl_adopt_slow(uint64_t key)
{
    if (!enabled || !key)
        return;
    wanted f = {.key = key};
    young_each(look, &f);
    if (!f.live && f.best)
        young_each(take_best, &f);
}

typedef struct peeked {
    uint64_t key;
    cs_event origin;
    int found, consumed;
} peeked;

static void peek_one(young *y, void *ud)
{
    peeked *p = ud;
    dl_young *d = &y->dl;
    unsigned i = young_place(p->key, DLY_BITS);
    if (!p->found && d->ev[i][0].obj == p->key) {
        p->origin = d->ev[i][0];
        p->consumed = d->consumed[i];
        p->found = 1;
    }
}

int cs_young_dl_peek(uint64_t key, cs_event *origin, int *consumed)
{
    if (!enabled || !key ||
        !atomic_load_explicit(&ylive[cs_lc_np_live_at(key)], memory_order_relaxed))
        return 0;
    peeked p = {.key = key};
    young_each(peek_one, &p);
    if (p.found) {
        *origin = p.origin;
        *consumed = p.consumed;
    }
    return p.found;
}

void cs_young_dl_flush_locked(young *y, int all)
{
    if (!enabled)
        return;
    dl_young *d = &y->dl;
    for (unsigned i = 0; i < DLY; i++)
        if (d->ev[i][0].obj)
            adopt_live(d, i);
    if (all)
        for (unsigned k = 0; k < DLG; k++)
            if (d->gone_n[k])
                adopt_gone(d, k);
}

size_t cs_young_dl_touched_locked(const young *y, uint64_t since_ns)
{
    size_t n = 0;
    const dl_young *d = &y->dl;
    for (unsigned i = 0; enabled && i < DLY; i++)
        if (d->ev[i][0].obj && d->nev[i] && d->ev[i][d->nev[i] - 1].time_ns >= since_ns)
            n++;
    return n;
}

void cs_young_dl_totals(const young *y, cs_lc_totals *add, uint64_t *events)
{
    add->dlpack += __atomic_load_n(&y->dl.live, __ATOMIC_RELAXED);
    add->dlpack_bytes += __atomic_load_n(&y->dl.live_bytes, __ATOMIC_RELAXED);
    add->born_dlpack += __atomic_load_n(&y->dl.born, __ATOMIC_RELAXED);
    *events += __atomic_load_n(&y->dl.events, __ATOMIC_RELAXED);
}

int cs_young_dl_init(cs_lifecycle *to)
{
    size_t n = (size_t)1 << CS_LC_NP_LIVE_BITS;
    if (!(cs_lc_dl_live = cs_calloc(n, sizeof *cs_lc_dl_live)) ||
        !(ylive = cs_calloc(n, sizeof *ylive)) ||
        !(cs_young_dl_held = cs_calloc(n, sizeof *cs_young_dl_held)))
        return 0;
    lc = to;
    enabled = 1;
    return 1;
}
