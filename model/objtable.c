/* The object table (see objtable.h): stripes, their locks, entries,
 * tombstones, histories and live totals. */
#include "objtable.h"
#include "growclean.h"

#include <linux/membarrier.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "alloc.h"
#include "sort.h"

cs_lifecycle *cs_lc_create(cs_finding_cb cb, void *ud, int threadsafe)
{
    cs_lifecycle *lc = cs_calloc(1, sizeof *lc);
    if (!lc)
        return NULL;
    lc->cb = cb;
    lc->ud = ud;
    lc->threadsafe = threadsafe;
    /* without expedited membarrier every section locks (cs_lc_lock) */
    if (threadsafe && syscall(SYS_membarrier, MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED, 0, 0) != 0)
        atomic_store(&lc->shared, 1);
    return lc; /* calloc: every lock starts clear */
}

void cs_lc_set_protect(cs_lifecycle *lc, int on) { lc->protect = on; }

void cs_lc_set_sink(cs_lifecycle *lc, cs_event_sink sink, void *ud)
{
    lc->sink = sink;
    lc->sink_ud = ud;
}

void cs_lc_destroy(cs_lifecycle *lc)
{
    if (!lc)
        return;
    for (int i = 0; i < NSTRIPES; i++) {
        stripe *st = &lc->s[i];
        for (size_t j = 0; j < st->cap; j++)
            cs_free(st->tab[j].hist);
        while (st->free_hist) {
            cs_event *h = st->free_hist;
            st->free_hist = *(cs_event **)h;
            cs_free(h);
        }
        cs_free(st->tab);
    }
    cs_free(lc->kept);
    cs_free(lc);
}

/* ---- locking: elided while one thread judges alone ----
 * Most programs judge every event on one thread, the one running Python,
 * and an uncontended atomic per event is still a cost there. The first
 * thread to lock becomes the owner: it marks itself inside with a plain
 * store (owner_in) and takes no lock while `shared` is 0. Another thread
 * that needs a stripe sets `shared`, then membarrier(2) runs a full barrier
 * on every running thread of the process, so either the owner sees
 * `shared` before it enters or its mark is visible; the newcomer waits for
 * the owner to leave. From then on every section locks. (The asymmetric
 * fence of liburcu and folly: the rare side pays the syscall.) */
static __thread int elided __attribute__((tls_model("initial-exec")));
static __thread int owner_self __attribute__((tls_model("initial-exec"))); /* 1: owner */

static void go_shared(cs_lifecycle *lc)
{
    unsigned long me = (unsigned long)pthread_self();
    cs_spin_lock(&lc->share_mu);
    if (!atomic_load(&lc->shared)) {
        atomic_store(&lc->shared, 1);
        syscall(SYS_membarrier, MEMBARRIER_CMD_PRIVATE_EXPEDITED, 0, 0);
        /* the owner itself (inside a section) has nothing to wait for */
        while (atomic_load_explicit(&lc->owner_in, memory_order_acquire) &&
               !(atomic_load(&lc->owner) == me && elided))
            sched_yield();
    }
    cs_spin_unlock(&lc->share_mu);
}

/* 1 if this thread may go in unlocked (and is now marked inside) */
static inline int enter_alone(cs_lifecycle *lc)
{
    if (atomic_load_explicit(&lc->shared, memory_order_relaxed))
        return 0;
    if (!owner_self) {
        unsigned long me = (unsigned long)pthread_self(), none = 0;
        if (!atomic_compare_exchange_strong(&lc->owner, &none, me) && none != me) {
            go_shared(lc);
            return 0;
        }
        owner_self = 1;
    }
    atomic_store_explicit(&lc->owner_in, 1, memory_order_relaxed);
    atomic_signal_fence(memory_order_seq_cst); /* membarrier orders the rest */
    if (!atomic_load_explicit(&lc->shared, memory_order_relaxed)) {
        elided = 1;
        return 1;
    }
    atomic_store_explicit(&lc->owner_in, 0, memory_order_release);
    return 0;
}

/* 1 if this thread's section was an unlocked one (and is now left) */
static inline int leave_alone(cs_lifecycle *lc)
{
    if (!elided)
        return 0;
    elided = 0;
    atomic_store_explicit(&lc->owner_in, 0, memory_order_release);
    return 1;
}

void ot_lock(cs_lifecycle *lc, stripe *st)
{
    if (lc->threadsafe && !enter_alone(lc))
        cs_spin_lock(&st->mu);
}

void ot_unlock(cs_lifecycle *lc, stripe *st)
{
    if (lc->threadsafe && !leave_alone(lc))
        cs_spin_unlock(&st->mu);
}

void cs_lc_lock(cs_lifecycle *lc, uint64_t o) { ot_lock(lc, ot_stripe_of(lc, o)); }
void cs_lc_unlock(cs_lifecycle *lc, uint64_t o) { ot_unlock(lc, ot_stripe_of(lc, o)); }

void cs_lc_lock_all(cs_lifecycle *lc)
{
    /* fork: the child has one thread and inherits `shared` set */
    go_shared(lc);
    for (int i = 0; i < NSTRIPES; i++)
        cs_spin_lock(&lc->s[i].mu);
}

void cs_lc_unlock_all(cs_lifecycle *lc)
{
    for (int i = 0; i < NSTRIPES; i++)
        cs_spin_unlock(&lc->s[i].mu);
}

/* ---- open-addressing table with backward-shift deletion ---- */

static int ot_grow(stripe *st)
{
    size_t ncap = st->cap ? st->cap * 2 : 64;
    obj *nt = cs_calloc(ncap, sizeof *nt);
    if (!nt)
        return -1;
    for (size_t j = 0; j < st->cap; j++) {
        obj *o = &st->tab[j];
        if (!o->key)
            continue;
        size_t i = ot_mix(o->key, o->ns) & (ncap - 1);
        while (nt[i].key)
            i = (i + 1) & (ncap - 1);
        nt[i] = *o;
    }
    /* freed memory keeps its bytes: the keys in it would pass for
     * references to live objects in the leak scan at exit (reach.c) */
    cs_free_clean(st->tab, st->cap * sizeof *st->tab);
    st->tab = nt;
    st->cap = ncap;
    return 0;
}

obj *ot_insert(stripe *st, uint64_t key, int ns)
{
    if ((st->used + 1) * 10 > st->cap * 7 && ot_grow(st) != 0)
        return NULL;
    size_t m = st->cap - 1;
    size_t i = ot_mix(key, ns) & m;
    while (st->tab[i].key)
        i = (i + 1) & m;
    obj *o = &st->tab[i];
    memset(o, 0, sizeof *o);
    o->key = key;
    o->ns = (uint8_t)ns;
    st->used++;
    return o;
}

static void ot_hist_release(stripe *st, cs_event *h)
{
    if (!h)
        return;
    *(cs_event **)h = st->free_hist;
    st->free_hist = h;
}

static void ot_erase(stripe *st, obj *o)
{
    size_t m = st->cap - 1;
    size_t i = (size_t)(o - st->tab);
    ot_hist_release(st, o->hist);
    for (size_t j = (i + 1) & m;; j = (j + 1) & m) {
        obj *n = &st->tab[j];
        if (!n->key)
            break;
        size_t home = ot_mix(n->key, n->ns) & m;
        /* move n back into the hole at i if its probe path crosses i */
        if (((j - home) & m) >= ((j - i) & m)) {
            st->tab[i] = *n;
            i = j;
        }
    }
    memset(&st->tab[i], 0, sizeof st->tab[i]);
    st->used--;
}


/* ---- object history ---- */

uint32_t (*cs_lc_live_put)(unsigned pool, const cs_event *origin, uint64_t bytes);
void (*cs_lc_live_consumed)(uint32_t slot, uint32_t stack);
void (*cs_lc_live_drop)(uint32_t slot);

/* the stripe's index: the live-state pool its objects' slots come from */
static inline unsigned pool_of(uint64_t key)
{
    return (unsigned)(((key >> 4) * 0xff51afd7ed558ccdull) >> 58);
}

static void mirror(obj *o)
{
    const cs_event *e = &o->hist[0];
    if (cs_lc_live_put && !o->slot && o->state != CS_ST_RELEASED &&
        ((e->kind == CS_EV_EXPORT && !(e->aux & CS_DLV_XVIEW)) || e->kind == CS_EV_NP_ALLOC ||
         e->kind == CS_EV_AR_EXPORT))
        o->slot = cs_lc_live_put(pool_of(o->key), e, o->bytes);
}

static inline void unmirror(obj *o)
{
    if (o->slot && cs_lc_live_drop)
        cs_lc_live_drop(o->slot);
    o->slot = 0;
}

void ot_hist_add(stripe *st, obj *o, const cs_event *ev, judge *j)
{
    if (j && ev == j->cur)
        j->in_hist = 1;
    enum { CAP = CS_FINDING_MAX_EVENTS - 1 };
    if (!o->hist) {
        if (st->free_hist) {
            o->hist = st->free_hist;
            st->free_hist = *(cs_event **)o->hist;
        } else if (!(o->hist = cs_malloc(CAP * sizeof *o->hist))) {
            return;
        }
    }
    if (o->nhist < CAP) {
        o->hist[o->nhist++] = *ev;
        if (o->nhist == 1)
            mirror(o); /* its first event made it */
    } else {
        /* keep the first events (export, consume) and the latest */
        o->hist[CAP - 1] = *ev;
        if (o->nflushed == CAP)
            o->nflushed = CAP - 1;
    }
    /* the current event already went to the sink with a finding about o
     * (reported before it was added): the sink must not get it twice */
    if (j && ev == j->cur && j->written && o->nflushed + 1u == o->nhist)
        o->nflushed = o->nhist;
}

/* Give the sink what it has not seen of o's history. */
static void ot_flush(cs_lifecycle *lc, obj *o, judge *j)
{
    if (!lc->sink)
        return;
    for (unsigned i = o->nflushed; i < o->nhist; i++) {
        lc->sink(lc->sink_ud, &o->hist[i]);
        if (j && j->in_hist && i == o->nhist - 1u)
            j->written = 1;
    }
    o->nflushed = o->nhist;
}

void (*cs_lc_data_watch)(uint64_t key, uint64_t data, uint64_t bytes, int sign);

/* o stops being a consumed tensor with a known data span */
static inline void unwatch(const obj *o)
{
    if (o->ns == CS_NS_DLPACK && o->state == CS_ST_CONSUMED && o->data && cs_lc_data_watch)
        cs_lc_data_watch(o->key, o->data, o->bytes, -1);
}

void ot_reset(stripe *st, obj *o)
{
    unwatch(o);
    unmirror(o);
    o->gen = ++st->gen;
    o->state = CS_ST_CREATED;
    o->flags = 0;
    o->nhist = 0;
    o->nflushed = 0;
    o->capsule = 0;
    o->data = 0;
    o->bytes = 0;
}

void ot_report(cs_lifecycle *lc, judge *j, int kind, obj *o, const cs_event *ev,
                   uint32_t detail, uint64_t value)
{
    /* the evidence reaches the trace before anyone hears of the finding */
    if (o && o->key) {
        o->flags |= OF_TRACED;
        atomic_store_explicit(&lc->any_traced, 1, memory_order_relaxed);
        ot_flush(lc, o, j);
    }
    if (lc->sink && j && ev == j->cur && !j->written) {
        lc->sink(lc->sink_ud, ev);
        j->written = 1;
    }
    cs_finding f;
    memset(&f, 0, sizeof f);
    f.kind = (uint16_t)kind;
    f.detail = detail;
    f.obj = o && o->key ? o->key : (ev ? ev->obj : 0);
    f.bytes = o ? o->bytes : 0;
    f.value = value;
    if (o)
        for (unsigned i = 0; i < o->nhist && f.nevents < CS_FINDING_MAX_EVENTS; i++)
            f.events[f.nevents++] = o->hist[i];
    if (ev && f.nevents < CS_FINDING_MAX_EVENTS)
        f.events[f.nevents++] = *ev;
    if (lc->indirect) {
        f.nindirect = lc->indirect->nindirect;
        f.indirect_bytes = lc->indirect->indirect_bytes;
        memcpy(f.indirect, lc->indirect->indirect, sizeof f.indirect);
    }
    if (lc->cb)
        lc->cb(lc->ud, &f);
}

void ot_trace(cs_lifecycle *lc, obj *o)
{
    o->flags |= OF_TRACED;
    atomic_store_explicit(&lc->any_traced, 1, memory_order_relaxed);
    ot_flush(lc, o, NULL);
}

/* ---- live totals: an object counts from creation to release ---- */
_Atomic uint16_t *cs_lc_np_live;
_Atomic uint16_t *cs_lc_dl_live;

void ot_count(stripe *st, const obj *o, int sign)
{
    int i = o->ns == CS_NS_NUMPY ? 2 : 0;
    _Atomic uint16_t *by_key = i ? cs_lc_np_live : o->ns == CS_NS_DLPACK ? cs_lc_dl_live : NULL;
    if (by_key)
        atomic_fetch_add_explicit(&by_key[cs_lc_np_live_at(o->key)], (uint16_t)sign,
                                  memory_order_relaxed);
    /* one writer (the stripe's lock holder); relaxed stores for readers */
    __atomic_store_n(&st->live[i], st->live[i] + sign, __ATOMIC_RELAXED);
    __atomic_store_n(&st->live[i + 1], st->live[i + 1] + sign * (int64_t)o->bytes, __ATOMIC_RELAXED);
    if (sign > 0 && !(o->flags & OF_VIEW))
        ot_born(st, i / 2);
}

/* a sum of unlocked reads: a moment's view, good enough for COUNTS. The
 * eight counters of a stripe lie together; their sums stay in registers
 * (a COUNTS record is due every 10 ms, and under callgrind, where time
 * runs 50 times slower, every few iterations of a benchmark loop) */
void cs_lc_tally(cs_lifecycle *lc, cs_lc_totals *t, uint64_t *events)
{
    int64_t l0 = 0, l1 = 0, l2 = 0, l3 = 0, b0 = 0, b1 = 0, b2 = 0;
    uint64_t n = 0;
    for (int i = 0; i < NSTRIPES; i++) {
        const stripe *st = &lc->s[i];
        n += __atomic_load_n(&st->nevents, __ATOMIC_RELAXED);
        l0 += __atomic_load_n(&st->live[0], __ATOMIC_RELAXED);
        l1 += __atomic_load_n(&st->live[1], __ATOMIC_RELAXED);
        l2 += __atomic_load_n(&st->live[2], __ATOMIC_RELAXED);
        l3 += __atomic_load_n(&st->live[3], __ATOMIC_RELAXED);
        b0 += __atomic_load_n(&st->born[0], __ATOMIC_RELAXED);
        b1 += __atomic_load_n(&st->born[1], __ATOMIC_RELAXED);
        b2 += __atomic_load_n(&st->born[2], __ATOMIC_RELAXED);
    }
    *t = (cs_lc_totals){.dlpack = l0, .dlpack_bytes = l1, .numpy = l2, .numpy_bytes = l3,
                        .born_dlpack = b0, .born_numpy = b1, .born_arrow = b2};
    if (cs_lc_outside)
        cs_lc_outside(t, &n);
    if (events)
        *events = n;
}

void cs_lc_totals_get(cs_lifecycle *lc, cs_lc_totals *t)
{
    cs_lc_tally(lc, t, NULL);
}

/* A released object becomes a tombstone; the oldest tombstone of the
 * stripe is forgotten when the FIFO is full. */
void ot_entomb(stripe *st, obj *o)
{
    unwatch(o);
    unmirror(o);
    if (o->state != CS_ST_RELEASED)
        ot_count(st, o, -1);
    o->state = CS_ST_RELEASED;
    if (st->fifo_len == TOMB_PER_STRIPE) {
        tomb *t = &st->fifo[st->fifo_head];
        st->fifo_head = (st->fifo_head + 1) % TOMB_PER_STRIPE;
        st->fifo_len--;
        obj *old = ot_find(st, t->key, t->ns);
        if (old && old->gen == t->gen && old->state == CS_ST_RELEASED) {
            /* o may move during erase: keep its identity */
            uint64_t k = o->key;
            int ns = o->ns;
            ot_erase(st, old);
            o = ot_find(st, k, ns);
            if (!o)
                return;
        }
    }
    tomb *t = &st->fifo[(st->fifo_head + st->fifo_len) % TOMB_PER_STRIPE];
    t->key = o->key;
    t->gen = o->gen;
    t->ns = o->ns;
    st->fifo_len++;
}

/* ---- blocks kept alive through interpreter shutdown ---- */
void ot_keep_at_shutdown(cs_lifecycle *lc, uint64_t data)
{
    cs_spin_lock(&lc->kept_mu);
    if (lc->nkept == lc->capkept) {
        size_t nc = lc->capkept ? lc->capkept * 2 : 64;
        uint64_t *n = cs_grow_clean(lc->kept, lc->nkept * sizeof *n, nc * sizeof *n);
        if (n) {
            lc->kept = n;
            lc->capkept = nc;
        }
    }
    if (lc->nkept < lc->capkept)
        lc->kept[lc->nkept++] = data;
    cs_spin_unlock(&lc->kept_mu);
}

int ot_kept_at_shutdown(cs_lifecycle *lc, uint64_t lo, uint64_t hi)
{
    int found = 0;
    cs_spin_lock(&lc->kept_mu);
    for (size_t i = 0; i < lc->nkept && !found; i++)
        found = lc->kept[i] >= lo && lc->kept[i] < hi;
    cs_spin_unlock(&lc->kept_mu);
    return found;
}

void (*cs_lc_outside)(cs_lc_totals *add, uint64_t *events);

uint64_t cs_lc_events(cs_lifecycle *lc)
{
    cs_lc_totals t;
    uint64_t n;
    cs_lc_tally(lc, &t, &n);
    return n;
}

void cs_lc_set_born(cs_lifecycle *lc, uint64_t time_ns)
{
    lc->born_ns = time_ns;
}

void cs_lc_fork_child(cs_lifecycle *lc)
{
    atomic_store(&lc->any_traced, 0);
    for (int i = 0; i < NSTRIPES; i++)
        lc->s[i].nevents = lc->s[i].born[0] = lc->s[i].born[1] = lc->s[i].born[2] = 0; /* its own */
    for (int i = 0; i < NSTRIPES; i++)
        for (size_t k = 0; k < lc->s[i].cap; k++) {
            obj *o = &lc->s[i].tab[k];
            o->flags &= (uint32_t)~OF_TRACED;
            o->nflushed = 0;
            o->slot = 0; /* in the parent's file: cs_lc_remirror makes new ones */
        }
}

void cs_lc_remirror(cs_lifecycle *lc)
{
    for (int i = 0; i < NSTRIPES; i++) {
        stripe *st = &lc->s[i];
        ot_lock(lc, st);
        for (size_t k = 0; k < st->cap; k++) {
            obj *o = &st->tab[k];
            if (!o->key || !o->nhist || o->state == CS_ST_RELEASED)
                continue;
            o->slot = 0;
            mirror(o);
            for (unsigned h = 1; h < o->nhist && o->slot && cs_lc_live_consumed; h++)
                if (o->hist[h].kind == CS_EV_CONSUME)
                    cs_lc_live_consumed(o->slot, o->hist[h].stack);
        }
        ot_unlock(lc, st);
    }
}

void ot_each_live(cs_lifecycle *lc, int ns, void (*fn)(cs_lifecycle *, obj *, void *),
                      void *ud)
{
    for (int i = 0; i < NSTRIPES; i++) {
        stripe *st = &lc->s[i];
        ot_lock(lc, st);
        for (size_t k = 0; k < st->cap; k++) {
            obj *o = &st->tab[k];
            if (o->key && o->ns == ns &&
                (o->state == CS_ST_CREATED || o->state == CS_ST_CONSUMED) &&
                !(o->flags & OF_LEAK_REPORTED))
                fn(lc, o, ud);
        }
        ot_unlock(lc, st);
    }
}

typedef struct key_list {
    uint64_t *v;
    size_t n, cap;
} key_list;

int ot_room_for_one(void *v, size_t n, size_t *cap, size_t elem)
{
    if (n < *cap)
        return 1;
    size_t nc = *cap ? *cap * 2 : 64;
    void *nb = cs_grow_clean(*(void **)v, n * elem, nc * elem);
    if (!nb)
        return 0;
    *(void **)v = nb;
    *cap = nc;
    return 1;
}

typedef struct filtered_keys {
    key_list l;
    int (*keep)(const obj *, void *);
    void *ud;
} filtered_keys;

static void collect_key(cs_lifecycle *lc, obj *o, void *ud)
{
    (void)lc;
    filtered_keys *f = ud;
    if ((!f->keep || f->keep(o, f->ud)) && ot_room_for_one(&f->l.v, f->l.n, &f->l.cap, sizeof *f->l.v))
        f->l.v[f->l.n++] = o->key;
}

int ot_cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return (x > y) - (x < y);
}

void cs_lc_own_memory(cs_lifecycle *lc, void (*fn)(void *ud, const void *p, size_t n), void *ud)
{
    enum { CAP = CS_FINDING_MAX_EVENTS - 1 };
    fn(ud, lc, sizeof *lc);
    fn(ud, lc->kept, lc->capkept * sizeof *lc->kept);
    for (int i = 0; i < NSTRIPES; i++) {
        stripe *st = &lc->s[i];
        fn(ud, st->tab, st->cap * sizeof *st->tab);
        for (size_t j = 0; j < st->cap; j++)
            if (st->tab[j].key && st->tab[j].hist)
                fn(ud, st->tab[j].hist, CAP * sizeof(cs_event));
        for (cs_event *h = st->free_hist; h; h = *(cs_event **)h)
            fn(ud, h, CAP * sizeof(cs_event));
    }
}

typedef struct held_list {
    const uint32_t *threads;
    size_t nthreads;
    cs_lc_held *v;
    size_t n, cap;
} held_list;

static void collect_held(cs_lifecycle *lc, obj *o, void *ud)
{
    (void)lc;
    held_list *l = ud;
    if (!o->nhist)
        return;
    uint32_t th = o->hist[o->nhist - 1].thread;
    for (size_t i = 0; i < l->nthreads; i++)
        if (l->threads[i] == th) {
            if (ot_room_for_one(&l->v, l->n, &l->cap, sizeof *l->v))
                l->v[l->n++] = (cs_lc_held){o->key, th};
            return;
        }
}

size_t cs_lc_live_held_by(cs_lifecycle *lc, int ns, const uint32_t *threads, size_t n,
                          cs_lc_held **out)
{
    held_list l = {threads, n, NULL, 0, 0};
    if (n)
        ot_each_live(lc, ns, collect_held, &l);
    *out = l.v;
    return l.n;
}

size_t ot_live_keys(cs_lifecycle *lc, int ns, int (*keep)(const obj *, void *), void *ud,
                    uint64_t **out)
{
    filtered_keys f = {{NULL, 0, 0}, keep, ud};
    ot_each_live(lc, ns, collect_key, &f);
    if (f.l.n)
        cs_sort(f.l.v, f.l.n, sizeof *f.l.v, ot_cmp_u64);
    *out = f.l.v;
    return f.l.n;
}

size_t cs_lc_live_keys(cs_lifecycle *lc, int ns, uint64_t **out)
{
    return ot_live_keys(lc, ns, NULL, NULL, out);
}

/* who holds a live DLPack tensor on the program's side: the consumer's
 * return address, or CS_LC_WHO_XFROM for one an exchange-API caller took */
static uint64_t consumer_of(const obj *o)
{
    for (unsigned i = 0; i < o->nhist; i++) {
        const cs_event *e = &o->hist[i];
        if (e->kind == CS_EV_CONSUME && e->b)
            return e->b;
        if (e->kind == CS_EV_EXPORT && (e->aux & CS_DLV_XFROM))
            return CS_LC_WHO_XFROM;
    }
    return 0;
}

void cs_lc_spans(cs_lifecycle *lc, const uint64_t *keys, size_t n, uint64_t *lo, uint64_t *hi,
                 uint64_t *who)
{
    for (size_t i = 0; i < n; i++) {
        stripe *st = ot_stripe_of(lc, keys[i]);
        ot_lock(lc, st);
        obj *o = ot_find(st, keys[i], CS_NS_NUMPY);
        lo[i] = hi[i] = who[i] = 0;
        if (o && o->state == CS_ST_CREATED) {
            lo[i] = o->key;
            hi[i] = ot_block_end(o);
        } else if ((o = ot_find(st, keys[i], CS_NS_DLPACK)) && o->data &&
                   (who[i] = consumer_of(o))) {
            lo[i] = o->data;
            hi[i] = o->data + (o->bytes ? o->bytes : 1);
        }
        ot_unlock(lc, st);
    }
}

int cs_lc_state(cs_lifecycle *lc, int ns, uint64_t o)
{
    obj *x = ot_find(ot_stripe_of(lc, o), o, ns);
    return x ? x->state : CS_ST_UNKNOWN;
}

int cs_lc_origin(cs_lifecycle *lc, int ns, uint64_t o, cs_event *out)
{
    obj *x = ot_find(ot_stripe_of(lc, o), o, ns);
    if (!x || !x->nhist)
        return 0;
    *out = x->hist[0];
    return 1;
}

size_t cs_lc_live(cs_lifecycle *lc)
{
    size_t n = 0;
    for (int i = 0; i < NSTRIPES; i++) {
        stripe *st = &lc->s[i];
        for (size_t j = 0; j < st->cap; j++)
            if (st->tab[j].key && st->tab[j].state != CS_ST_RELEASED)
                n++;
    }
    return n;
}

/* live, unreported, and its latest event (the history keeps it last) at
 * or after since_ns */
static int touched(const obj *o, uint64_t since_ns)
{
    return o->key && (o->state == CS_ST_CREATED || o->state == CS_ST_CONSUMED) &&
           !(o->flags & OF_LEAK_REPORTED) &&
           (!o->nhist || o->hist[o->nhist - 1].time_ns >= since_ns);
}

size_t cs_lc_touched_since(cs_lifecycle *lc, uint64_t since_ns)
{
    size_t n = 0;
    for (int i = 0; i < NSTRIPES; i++) {
        stripe *st = &lc->s[i];
        ot_lock(lc, st);
        for (size_t k = 0; k < st->cap; k++)
            n += (size_t)touched(&st->tab[k], since_ns);
        ot_unlock(lc, st);
    }
    return n;
}

static int keep_touched(const obj *o, void *ud) { return touched(o, *(const uint64_t *)ud); }

size_t cs_lc_touched_keys(cs_lifecycle *lc, int ns, uint64_t since_ns, uint64_t **out)
{
    return ot_live_keys(lc, ns, keep_touched, &since_ns, out);
}
