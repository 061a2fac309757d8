/* Events -> findings: the DLPack state machine (CREATED -> CONSUMED ->
 * RELEASED, rulebook R3..R21) and NumPy block pairing (R29).
 *
 * Objects are keyed by (namespace, address) in NSTRIPES open-addressing
 * tables. Released objects stay as tombstones so that a repeated delete or
 * free is recognised; each stripe keeps at most TOMB_PER_STRIPE of them in a
 * FIFO, a bound shared by the runtime and the reader so both judge alike. */
#include "lifecycle.h"
#include "spin.h"

#include <linux/membarrier.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#define NSTRIPES 64
#define TOMB_PER_STRIPE 128

static const struct {
    const char *name;
    int sev;
    const char *help;
} kinds[CS_KIND_COUNT] = {
    [CS_KIND_NONE] = {"none", 0, ""},
#define KIND(e, n, s, h) [CS_KIND_##e] = {n, s, h},
#include "kinds.inc"
#undef KIND
};

const char *cs_kind_name(int k) { return k > 0 && k < CS_KIND_COUNT ? kinds[k].name : "unknown"; }
int cs_kind_severity(int k) { return k > 0 && k < CS_KIND_COUNT ? kinds[k].sev : 0; }
const char *cs_kind_help(int k) { return k > 0 && k < CS_KIND_COUNT ? kinds[k].help : ""; }

int cs_kind_from_name(const char *name)
{
    for (int k = 1; k < CS_KIND_COUNT; k++)
        if (strcmp(kinds[k].name, name) == 0)
            return k;
    return CS_KIND_NONE;
}

/* Per-object flags */
#define OF_VERSIONED 0x01
#define OF_CAPSULE_DEAD 0x02   /* the exporting capsule was destroyed */
#define OF_CAPSULE_USED 0x04   /* the exporting capsule was renamed used_* */
#define OF_NOT_RENAMED 0x08    /* dlpack-not-renamed already reported */
#define OF_LEAK_REPORTED 0x10
#define OF_UNCHECKED 0x20      /* dlpack-unchecked-destructor already reported */
#define OF_NULL_DELETER 0x40 /* nothing can release it: never a leak */
#define OF_TRACED 0x80       /* has a finding: its events go to the sink */
#define OF_REACHABLE 0x100   /* at exit, module static data still points to it */
#define OF_MUTATED 0x200     /* an R20 change already reported: one change, one finding */
#define OF_UNRENAMED 0x400   /* released while its capsule still had the unconsumed name:
                              * dlpack-not-renamed unless the consumer renames it next */

typedef struct obj {
    uint64_t key;      /* address; 0 = empty slot */
    uint32_t gen;      /* bumped on reuse, matches tombstone FIFO entries */
    uint8_t ns;
    uint8_t state;     /* cs_obj_state */
    uint16_t flags;
    uint8_t nhist;
    uint8_t nflushed;  /* history events already given to the sink */
    uint64_t capsule;  /* the exporting capsule */
    uint64_t data;     /* DLPack: dl_tensor.data as consumed (0 if not known) */
    uint64_t bytes;
    cs_event *hist;    /* up to CS_FINDING_MAX_EVENTS - 1 events, malloc'd */
} obj;

typedef struct tomb {
    uint64_t key;
    uint32_t gen;
    uint8_t ns;
} tomb;

typedef struct stripe {
    cs_spin mu;
    obj *tab;
    size_t cap, used;
    tomb fifo[TOMB_PER_STRIPE];
    cs_event *free_hist;   /* recycled history blocks (first word links them) */
    unsigned fifo_head, fifo_len;
    uint64_t nevents;      /* events judged here (counted under mu) */
    int64_t live[4];       /* this stripe's share of cs_lc_totals (under mu) */
    uint32_t gen;          /* generations of this stripe's objects (under mu) */
    char pad[64];
} stripe;

struct cs_lifecycle {
    cs_finding_cb cb;
    void *ud;
    int threadsafe;
    int protect;
    cs_event_sink sink;
    void *sink_ud;
    /* data released by a deleter that ran during interpreter shutdown:
     * numpy's own deleter then keeps its array alive on purpose (numpy PR
     * 22510), so those blocks were referenced at shutdown, not leaked */
    cs_spin kept_mu;
    uint64_t *kept;
    size_t nkept, capkept;
    _Atomic int any_traced; /* some object has a finding: look for it per event */
    /* stripe locks elided while one thread judges alone (cs_lc_lock) */
    _Atomic int shared;            /* 1: every section takes its stripe lock */
    _Atomic unsigned long owner;   /* the thread judging alone (pthread_self) */
    _Atomic int owner_in;          /* the owner is inside an unlocked section */
    cs_spin share_mu;
    stripe s[NSTRIPES];
};

/* table index: a multiply, its high bits folded down (heap addresses have
 * zero low bits, which a product alone keeps in its low bits) */
static inline uint64_t mix(uint64_t k, int ns)
{
    k = (k ^ (uint64_t)ns) * 0x9e3779b97f4a7c15ull;
    return k ^ (k >> 29);
}

static inline stripe *stripe_of(cs_lifecycle *lc, uint64_t obj)
{
    /* the top bits of another product (Fibonacci hashing); both namespaces
     * of one address share a stripe: one lock covers both */
    _Static_assert(NSTRIPES == 64, "6 bits of stripe");
    return &lc->s[((obj >> 4) * 0xff51afd7ed558ccdull) >> 58];
}

cs_lifecycle *cs_lc_create(cs_finding_cb cb, void *ud, int threadsafe)
{
    cs_lifecycle *lc = calloc(1, sizeof *lc);
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
            free(st->tab[j].hist);
        while (st->free_hist) {
            cs_event *h = st->free_hist;
            st->free_hist = *(cs_event **)h;
            free(h);
        }
        free(st->tab);
    }
    free(lc->kept);
    free(lc);
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

static void lock_stripe(cs_lifecycle *lc, stripe *st)
{
    if (lc->threadsafe && !enter_alone(lc))
        cs_spin_lock(&st->mu);
}

static void unlock_stripe(cs_lifecycle *lc, stripe *st)
{
    if (lc->threadsafe && !leave_alone(lc))
        cs_spin_unlock(&st->mu);
}

void cs_lc_lock(cs_lifecycle *lc, uint64_t o) { lock_stripe(lc, stripe_of(lc, o)); }
void cs_lc_unlock(cs_lifecycle *lc, uint64_t o) { unlock_stripe(lc, stripe_of(lc, o)); }

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

static obj *find(stripe *st, uint64_t key, int ns)
{
    if (!st->cap)
        return NULL;
    size_t m = st->cap - 1;
    for (size_t i = mix(key, ns) & m;; i = (i + 1) & m) {
        obj *o = &st->tab[i];
        if (!o->key)
            return NULL;
        if (o->key == key && o->ns == ns)
            return o;
    }
}

static int grow(stripe *st)
{
    size_t ncap = st->cap ? st->cap * 2 : 64;
    obj *nt = calloc(ncap, sizeof *nt);
    if (!nt)
        return -1;
    for (size_t j = 0; j < st->cap; j++) {
        obj *o = &st->tab[j];
        if (!o->key)
            continue;
        size_t i = mix(o->key, o->ns) & (ncap - 1);
        while (nt[i].key)
            i = (i + 1) & (ncap - 1);
        nt[i] = *o;
    }
    free(st->tab);
    st->tab = nt;
    st->cap = ncap;
    return 0;
}

static obj *insert(stripe *st, uint64_t key, int ns)
{
    if ((st->used + 1) * 10 > st->cap * 7 && grow(st) != 0)
        return NULL;
    size_t m = st->cap - 1;
    size_t i = mix(key, ns) & m;
    while (st->tab[i].key)
        i = (i + 1) & m;
    obj *o = &st->tab[i];
    memset(o, 0, sizeof *o);
    o->key = key;
    o->ns = (uint8_t)ns;
    st->used++;
    return o;
}

static void hist_release(stripe *st, cs_event *h)
{
    if (!h)
        return;
    *(cs_event **)h = st->free_hist;
    st->free_hist = h;
}

static void erase(stripe *st, obj *o)
{
    size_t m = st->cap - 1;
    size_t i = (size_t)(o - st->tab);
    hist_release(st, o->hist);
    for (size_t j = (i + 1) & m;; j = (j + 1) & m) {
        obj *n = &st->tab[j];
        if (!n->key)
            break;
        size_t home = mix(n->key, n->ns) & m;
        /* move n back into the hole at i if its probe path crosses i */
        if (((j - home) & m) >= ((j - i) & m)) {
            st->tab[i] = *n;
            i = j;
        }
    }
    memset(&st->tab[i], 0, sizeof st->tab[i]);
    st->used--;
}

/* ---- one judgement: did the current event reach the sink? ---- */
typedef struct judge {
    const cs_event *cur;
    int in_hist;   /* cur was appended to its object's history */
    int written;   /* cur went to the sink */
} judge;

/* ---- object history ---- */

static void hist_add(stripe *st, obj *o, const cs_event *ev, judge *j)
{
    if (j && ev == j->cur)
        j->in_hist = 1;
    enum { CAP = CS_FINDING_MAX_EVENTS - 1 };
    if (!o->hist) {
        if (st->free_hist) {
            o->hist = st->free_hist;
            st->free_hist = *(cs_event **)o->hist;
        } else if (!(o->hist = malloc(CAP * sizeof *o->hist))) {
            return;
        }
    }
    if (o->nhist < CAP) {
        o->hist[o->nhist++] = *ev;
    } else {
        /* keep the first events (export, consume) and the latest */
        o->hist[CAP - 1] = *ev;
        if (o->nflushed == CAP)
            o->nflushed = CAP - 1;
    }
}

/* Give the sink what it has not seen of o's history. */
static void flush(cs_lifecycle *lc, obj *o, judge *j)
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

static void reset(stripe *st, obj *o)
{
    o->gen = ++st->gen;
    o->state = CS_ST_CREATED;
    o->flags = 0;
    o->nhist = 0;
    o->nflushed = 0;
    o->capsule = 0;
    o->data = 0;
    o->bytes = 0;
}

static void report(cs_lifecycle *lc, judge *j, int kind, obj *o, const cs_event *ev,
                   uint32_t detail, uint64_t value)
{
    /* the evidence reaches the trace before anyone hears of the finding */
    if (o && o->key) {
        o->flags |= OF_TRACED;
        atomic_store_explicit(&lc->any_traced, 1, memory_order_relaxed);
        flush(lc, o, j);
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
    if (lc->cb)
        lc->cb(lc->ud, &f);
}

/* ---- live totals: an object counts from creation to release ---- */
static void count(stripe *st, const obj *o, int sign)
{
    int i = o->ns == CS_NS_NUMPY ? 2 : 0;
    /* one writer (the stripe's lock holder); relaxed stores for readers */
    __atomic_store_n(&st->live[i], st->live[i] + sign, __ATOMIC_RELAXED);
    __atomic_store_n(&st->live[i + 1], st->live[i + 1] + sign * (int64_t)o->bytes, __ATOMIC_RELAXED);
}

/* a sum of unlocked reads: a moment's view, good enough for COUNTS */
void cs_lc_totals_get(cs_lifecycle *lc, cs_lc_totals *t)
{
    int64_t v[4] = {0};
    for (int i = 0; i < NSTRIPES; i++)
        for (int k = 0; k < 4; k++)
            v[k] += __atomic_load_n(&lc->s[i].live[k], __ATOMIC_RELAXED);
    t->dlpack = v[0];
    t->dlpack_bytes = v[1];
    t->numpy = v[2];
    t->numpy_bytes = v[3];
}

/* A released object becomes a tombstone; the oldest tombstone of the
 * stripe is forgotten when the FIFO is full. */
static void entomb(stripe *st, obj *o)
{
    if (o->state != CS_ST_RELEASED)
        count(st, o, -1);
    o->state = CS_ST_RELEASED;
    if (st->fifo_len == TOMB_PER_STRIPE) {
        tomb *t = &st->fifo[st->fifo_head];
        st->fifo_head = (st->fifo_head + 1) % TOMB_PER_STRIPE;
        st->fifo_len--;
        obj *old = find(st, t->key, t->ns);
        if (old && old->gen == t->gen && old->state == CS_ST_RELEASED) {
            /* o may move during erase: keep its identity */
            uint64_t k = o->key;
            int ns = o->ns;
            erase(st, old);
            o = find(st, k, ns);
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
static void keep_at_shutdown(cs_lifecycle *lc, uint64_t data)
{
    cs_spin_lock(&lc->kept_mu);
    if (lc->nkept == lc->capkept) {
        size_t nc = lc->capkept ? lc->capkept * 2 : 64;
        uint64_t *n = realloc(lc->kept, nc * sizeof *n);
        if (n) {
            lc->kept = n;
            lc->capkept = nc;
        }
    }
    if (lc->nkept < lc->capkept)
        lc->kept[lc->nkept++] = data;
    cs_spin_unlock(&lc->kept_mu);
}

static int kept_at_shutdown(cs_lifecycle *lc, uint64_t data)
{
    int found = 0;
    cs_spin_lock(&lc->kept_mu);
    for (size_t i = 0; i < lc->nkept && !found; i++)
        found = lc->kept[i] == data;
    cs_spin_unlock(&lc->kept_mu);
    return found;
}

/* ---- DLPack ---- */

/* A consumer released the tensor and left its capsule unconsumed, and the
 * capsule was used after that (its destructor deleting again, a read, its
 * death): dlpack-not-renamed, once, with ev as the evidence. */
static void not_renamed(cs_lifecycle *lc, stripe *st, obj *o, const cs_event *ev, judge *j)
{
    o->flags &= (uint16_t)~OF_UNRENAMED;
    o->flags |= OF_NOT_RENAMED;
    if (ev)
        hist_add(st, o, ev, j);
    report(lc, j, CS_KIND_DLPACK_NOT_RENAMED, o, NULL, 0, 0);
}

static unsigned dlpack_event(cs_lifecycle *lc, stripe *st, obj *o, const cs_event *ev, judge *j)
{
    unsigned verdict = 0;

    switch (ev->kind) {
    case CS_EV_EXPORT:
        if (o && (o->state == CS_ST_CREATED || o->state == CS_ST_CONSUMED)) {
            /* the same live struct in a second capsule: judge the newest */
            hist_add(st, o, ev, j);
            o->capsule = ev->a;
            o->flags &= (uint16_t)~(OF_CAPSULE_DEAD | OF_CAPSULE_USED);
            return 0;
        }
        if (!o && !(o = insert(st, ev->obj, CS_NS_DLPACK)))
            return 0;
        reset(st, o);
        o->capsule = ev->a;
        o->bytes = ev->c;
        count(st, o, 1);
        if (ev->aux & CS_DLV_VERSIONED)
            o->flags |= OF_VERSIONED;
        if (ev->flags & CS_EVF_NULL_DELETER)
            o->flags |= OF_NULL_DELETER;
        hist_add(st, o, ev, j);
        if (ev->flags & CS_EVF_NULL_DELETER)
            report(lc, j, CS_KIND_DLPACK_NULL_DELETER, o, NULL, 0, 0);
        return 0;

    case CS_EV_BAD_TENSOR:
        if (o) {
            /* a change made before the consume is seen again at the delete */
            if (ev->extra == CS_BAD_MUTATED) {
                if (o->flags & OF_MUTATED)
                    return 0;
                o->flags |= OF_MUTATED;
            }
            report(lc, j, CS_KIND_DLPACK_BAD_TENSOR, o, ev, ev->extra, ev->b);
        } else {
            obj tmp = {.key = ev->obj};
            report(lc, j, CS_KIND_DLPACK_BAD_TENSOR, &tmp, ev, ev->extra, ev->b);
        }
        return 0;

    case CS_EV_OWN:
        if (o && o->state != CS_ST_RELEASED)
            hist_add(st, o, ev, j);
        return 0;

    case CS_EV_CONSUME:
        if (!o)
            return 0; /* exported before capsan started */
        if (o->state == CS_ST_RELEASED && (o->flags & OF_UNRENAMED) && ev->a == o->capsule) {
            /* released, then renamed: the consumer took ownership and let
             * go before it renamed (JAX does, when it copies the data). The
             * name now keeps the producer's destructor away: no harm done */
            o->flags &= (uint16_t)~OF_UNRENAMED;
            o->flags |= OF_CAPSULE_USED;
            hist_add(st, o, ev, j);
            return CS_VERDICT_LATE_RENAME;
        }
        if (o->state == CS_ST_CREATED) {
            o->state = CS_ST_CONSUMED;
            if (!(ev->flags & CS_EVF_OFFSET_IGNORED))
                o->data = ev->c;
            if (ev->a == o->capsule)
                o->flags |= OF_CAPSULE_USED;
            hist_add(st, o, ev, j);
            if (ev->flags & CS_EVF_OFFSET_IGNORED)
                report(lc, j, CS_KIND_DLPACK_BYTE_OFFSET_IGNORED, o, NULL, 0, ev->c);
        } else {
            report(lc, j, CS_KIND_DLPACK_RECONSUME, o, ev, o->state, 0);
            hist_add(st, o, ev, j);
        }
        return 0;

    case CS_EV_GETPTR_USED:
    case CS_EV_GETPTR:
        /* only a consumer's read of a consumed or released tensor is
         * recorded by the runtime; the destructor's own reads are not */
        if (o && (o->state == CS_ST_CONSUMED || o->state == CS_ST_RELEASED) &&
            !(ev->flags & CS_EVF_IN_DTOR)) {
            if (o->state == CS_ST_RELEASED && (o->flags & OF_NOT_RENAMED))
                return 0; /* the unrenamed capsule: already explained */
            if (o->state == CS_ST_RELEASED && (o->flags & OF_UNRENAMED)) {
                /* read through the capsule its consumer released but left
                 * unconsumed: the missing rename explains it */
                not_renamed(lc, st, o, ev, j);
                return 0;
            }
            report(lc, j, CS_KIND_DLPACK_RECONSUME, o, ev, o->state, 0);
            hist_add(st, o, ev, j);
        }
        return 0;

    case CS_EV_DELETE: {
        if (!o)
            return 0;
        if ((ev->flags & CS_EVF_NO_PYTHON) && ev->c)
            keep_at_shutdown(lc, ev->c);
        int in_own_dtor = (ev->flags & CS_EVF_IN_DTOR) && ev->a == o->capsule;
        switch (o->state) {
        case CS_ST_CREATED:
            hist_add(st, o, ev, j);
            entomb(st, o);
            if (!in_own_dtor && !(o->flags & OF_CAPSULE_DEAD)) {
                /* the capsule still says "dltensor" (R8): judged by what
                 * comes next. A rename now is a late one (JAX renames just
                 * after a copy released the tensor); the destructor
                 * deleting again, a read through the capsule, or its death
                 * with the unconsumed name is dlpack-not-renamed */
                o = find(st, ev->obj, CS_NS_DLPACK); /* entomb may move it */
                if (o)
                    o->flags |= OF_UNRENAMED;
                return CS_VERDICT_UNRENAMED;
            }
            return 0;
        case CS_ST_CONSUMED:
            if (in_own_dtor) {
                /* R3: a consumed capsule's destructor must not delete */
                if (!(o->flags & OF_UNCHECKED)) {
                    o->flags |= OF_UNCHECKED;
                    report(lc, j, CS_KIND_DLPACK_UNCHECKED_DESTRUCTOR, o, ev, 0, 0);
                }
                hist_add(st, o, ev, j);
                /* unprotected, the call runs and releases the tensor; the
                 * consumer's own delete later is the double free this
                 * finding already explains */
                if (!lc->protect)
                    entomb(st, o);
                return CS_VERDICT_SKIP;
            }
            hist_add(st, o, ev, j);
            entomb(st, o);
            return 0;
        case CS_ST_RELEASED:
            verdict = CS_VERDICT_SKIP;
            if ((o->flags & OF_UNRENAMED) && in_own_dtor) {
                /* the double delete the missing rename leads to, reported
                 * before it runs */
                not_renamed(lc, st, o, ev, j);
                return verdict;
            }
            if ((o->flags & OF_NOT_RENAMED) && in_own_dtor) {
                /* the double delete that dlpack-not-renamed predicted */
                hist_add(st, o, ev, j);
                return verdict;
            }
            if ((o->flags & OF_UNCHECKED) && !in_own_dtor) {
                hist_add(st, o, ev, j); /* the consumer's delete after an unchecked destructor */
                return verdict;
            }
            if (in_own_dtor && (o->flags & OF_CAPSULE_USED)) {
                if (!(o->flags & OF_UNCHECKED)) {
                    o->flags |= OF_UNCHECKED;
                    report(lc, j, CS_KIND_DLPACK_UNCHECKED_DESTRUCTOR, o, ev, 0, 0);
                }
                hist_add(st, o, ev, j);
                return verdict;
            }
            report(lc, j, CS_KIND_DLPACK_DOUBLE_DELETE, o, ev, 0, 0);
            hist_add(st, o, ev, j);
            return verdict;
        }
        return 0;
    }

    case CS_EV_NO_GIL: {
        /* obj is the call site, already deduplicated by the runtime */
        obj tmp = {.key = ev->obj};
        int kind = ev->aux == CS_NOGIL_IN_DELETER ? CS_KIND_DLPACK_DELETER_NO_GIL
                 : ev->aux == CS_NOGIL_HANDLER    ? CS_KIND_NUMPY_HANDLER_NO_GIL
                                                  : CS_KIND_CAPSULE_NO_GIL;
        report(lc, j, kind, &tmp, ev, ev->aux, ev->a);
        return 0;
    }

    case CS_EV_DEVICE:
        if (o) {
            hist_add(st, o, ev, j);
            report(lc, j, CS_KIND_DLPACK_DEVICE_MISMATCH, o, NULL, ev->aux, ev->b);
        }
        return 0;

    case CS_EV_DESTROY:
        if (!o || ev->a != o->capsule)
            return 0;
        o->flags |= OF_CAPSULE_DEAD;
        if (o->state == CS_ST_RELEASED && (o->flags & OF_UNRENAMED)) {
            /* died with the unconsumed name after its tensor was released:
             * whatever its destructor did, the consumer never renamed it */
            not_renamed(lc, st, o, ev, j);
            return 0;
        }
        if (o->state == CS_ST_CREATED && (ev->extra & CS_DESTROY_TOOK)) {
            /* the destructor took the tensor by its unconsumed name and
             * released it without the deleter field (JAX's calls its
             * deleter function directly): released, not leaked */
            hist_add(st, o, ev, j);
            entomb(st, o);
            return 0;
        }
        if (o->state == CS_ST_CREATED && !(o->flags & (OF_LEAK_REPORTED | OF_NULL_DELETER))) {
            /* R3: an unconsumed capsule died and nobody released the tensor */
            hist_add(st, o, ev, j);
            o->flags |= OF_LEAK_REPORTED;
            report(lc, j, CS_KIND_DLPACK_LEAK, o, NULL,
                   (ev->extra & CS_DESTROY_NO_DTOR) ? CS_LEAK_NULL_DESTRUCTOR : CS_LEAK_DESTROYED,
                   0);
        }
        return 0;
    }
    return 0;
}

/* ---- NumPy data blocks ---- */

static unsigned numpy_event(cs_lifecycle *lc, stripe *st, obj *o, const cs_event *ev, judge *j)
{
    switch (ev->kind) {
    case CS_EV_NP_ALLOC:
        if (!ev->obj)
            return 0; /* R32: numpy 1.24 tracks failed allocations as NULL */
        if (o && o->state == CS_ST_CREATED)
            count(st, o, -1); /* a missed free: the old block is gone */
        if (!o && !(o = insert(st, ev->obj, CS_NS_NUMPY)))
            return 0;
        reset(st, o);
        o->bytes = ev->a;
        count(st, o, 1);
        hist_add(st, o, ev, j);
        return 0;
    case CS_EV_NP_FREE:
        if (!ev->obj)
            return 0; /* R29: free(NULL, n) from sort is legal */
        if (o && o->state == CS_ST_CREATED) {
            uint32_t stale = ev->extra;
            if (!stale && o->nhist && o->hist[0].c && ev->c && o->hist[0].c != ev->c)
                stale = CS_STALE_OTHER;
            hist_add(st, o, ev, j);
            if (stale)
                report(lc, j, CS_KIND_NUMPY_STALE_HANDLER, o, NULL, stale, ev->c);
            entomb(st, o);
        } else if (o && o->state == CS_ST_RELEASED && ev->c) {
            /* a legacy PyDataMem_FREE (c == 0) may free a block that came
             * back out of numpy's small-block cache unseen: not judged */
            report(lc, j, CS_KIND_NUMPY_DOUBLE_FREE, o, ev, 0, 0);
            hist_add(st, o, ev, j);
        }
        /* an unknown block may predate capsan (import capsan starts late) */
        return 0;
    case CS_EV_NP_FOREIGN_FREE:
        if (o && o->state == CS_ST_CREATED) {
            hist_add(st, o, ev, j);
            report(lc, j, CS_KIND_NUMPY_FOREIGN_FREE, o, NULL, 0, 0);
            entomb(st, o);
        } else {
            obj tmp = {.key = ev->obj};
            report(lc, j, CS_KIND_NUMPY_FOREIGN_FREE, &tmp, ev, 0, 0);
        }
        return 0;
    case CS_EV_NP_REACHABLE:
        if (o && o->state == CS_ST_CREATED)
            o->flags |= OF_REACHABLE;
        return 0;
    case CS_EV_NP_HANDLER:
        if (ev->extra) {
            obj tmp = {.key = ev->obj};
            report(lc, j, CS_KIND_NUMPY_BAD_HANDLER, &tmp, ev, ev->extra, ev->b);
        }
        return 0;
    }
    return 0;
}

/* With protect=1, a delete that will be judged skippable is not run: the
 * copy that reaches the trace says so (the runtime marks its own copy). */
static int delete_will_skip(stripe *st, const cs_event *ev)
{
    const obj *o = find(st, ev->obj, CS_NS_DLPACK);
    if (!o)
        return 0;
    int in_own_dtor = (ev->flags & CS_EVF_IN_DTOR) && ev->a == o->capsule;
    return o->state == CS_ST_RELEASED || (o->state == CS_ST_CONSUMED && in_own_dtor);
}

unsigned cs_lc_judge(cs_lifecycle *lc, const cs_event *ev, cs_event *origin, int *found)
{
    stripe *st = stripe_of(lc, ev->obj);
    st->nevents++;
    cs_event marked;
    if (lc->protect && lc->sink && ev->kind == CS_EV_DELETE && delete_will_skip(st, ev)) {
        marked = *ev;
        marked.flags |= CS_EVF_SKIPPED;
        ev = &marked;
    }
    judge j = {ev, 0, 0};
    int ns = ev->kind >= CS_EV_NP_ALLOC ? CS_NS_NUMPY : CS_NS_DLPACK;
    obj *o = find(st, ev->obj, ns);
    if (found) {
        /* what the object was made by, as it stood before this event */
        *found = !(o && o->nhist) ? 0 : o->state == CS_ST_RELEASED ? 2 : 1;
        if (*found)
            *origin = o->hist[0];
    }
    unsigned v = ns == CS_NS_NUMPY ? numpy_event(lc, st, o, ev, &j) : dlpack_event(lc, st, o, ev, &j);
    if (lc->sink && !j.written && atomic_load_explicit(&lc->any_traced, memory_order_relaxed)) {
        /* an object with findings keeps being written as it happens (it
         * may have moved in the table: look it up again) */
        o = find(st, ev->obj, ns);
        if (o && (o->flags & OF_TRACED)) {
            lc->sink(lc->sink_ud, ev);
            if (j.in_hist)
                o->nflushed = o->nhist;
        }
    }
    return v;
}

unsigned cs_lc_event(cs_lifecycle *lc, const cs_event *ev)
{
    return cs_lc_judge(lc, ev, NULL, NULL);
}

uint64_t cs_lc_events(cs_lifecycle *lc)
{
    uint64_t n = 0;
    for (int i = 0; i < NSTRIPES; i++)
        n += __atomic_load_n(&lc->s[i].nevents, __ATOMIC_RELAXED);
    return n;
}

void cs_lc_fork_child(cs_lifecycle *lc)
{
    atomic_store(&lc->any_traced, 0);
    for (int i = 0; i < NSTRIPES; i++)
        lc->s[i].nevents = 0;
    for (int i = 0; i < NSTRIPES; i++)
        for (size_t k = 0; k < lc->s[i].cap; k++) {
            obj *o = &lc->s[i].tab[k];
            o->flags &= (uint16_t)~OF_TRACED;
            o->nflushed = 0;
        }
}

/* Call fn on every live, unreported object of namespace ns, its stripe
 * locked. */
static void each_live(cs_lifecycle *lc, int ns, void (*fn)(cs_lifecycle *, obj *, void *),
                      void *ud)
{
    for (int i = 0; i < NSTRIPES; i++) {
        stripe *st = &lc->s[i];
        lock_stripe(lc, st);
        for (size_t k = 0; k < st->cap; k++) {
            obj *o = &st->tab[k];
            if (o->key && o->ns == ns && o->state == CS_ST_CREATED &&
                !(o->flags & OF_LEAK_REPORTED))
                fn(lc, o, ud);
        }
        unlock_stripe(lc, st);
    }
}

typedef struct live_report {
    uint64_t origin_c;
    int n;
} live_report;

static void report_if_from(cs_lifecycle *lc, obj *o, void *ud)
{
    live_report *r = ud;
    if (!o->nhist || o->hist[0].c != r->origin_c)
        return;
    if (o->ns == CS_NS_NUMPY && (o->hist[0].flags & CS_EVF_IMPORT))
        return; /* module data made by an import inside the scope (numpy 2
                 * imports numpy.random at first use): as at exit, not a leak */
    o->flags |= OF_LEAK_REPORTED;
    report(lc, NULL, o->ns == CS_NS_NUMPY ? CS_KIND_NUMPY_LEAK : CS_KIND_DLPACK_LEAK, o, NULL, 0,
           0);
    r->n++;
}

int cs_lc_report_live(cs_lifecycle *lc, int ns, uint64_t origin_c)
{
    live_report r = {origin_c, 0};
    each_live(lc, ns, report_if_from, &r);
    return r.n;
}

typedef struct key_list {
    uint64_t *v;
    size_t n, cap;
} key_list;

/* Room for one more element of size `elem` in *v (n used of *cap);
 * 0 when out of memory. */
static int room_for_one(void *v, size_t n, size_t *cap, size_t elem)
{
    if (n < *cap)
        return 1;
    size_t nc = *cap ? *cap * 2 : 64;
    void *nb = realloc(*(void **)v, nc * elem);
    if (!nb)
        return 0;
    *(void **)v = nb;
    *cap = nc;
    return 1;
}

static void collect_key(cs_lifecycle *lc, obj *o, void *ud)
{
    (void)lc;
    key_list *l = ud;
    if (room_for_one(&l->v, l->n, &l->cap, sizeof *l->v))
        l->v[l->n++] = o->key;
}

static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return (x > y) - (x < y);
}

size_t cs_lc_live_keys(cs_lifecycle *lc, int ns, uint64_t **out)
{
    key_list l = {NULL, 0, 0};
    each_live(lc, ns, collect_key, &l);
    if (l.n)
        qsort(l.v, l.n, sizeof *l.v, cmp_u64);
    *out = l.v;
    return l.n;
}

int cs_lc_state(cs_lifecycle *lc, int ns, uint64_t o)
{
    obj *x = find(stripe_of(lc, o), o, ns);
    return x ? x->state : CS_ST_UNKNOWN;
}

int cs_lc_origin(cs_lifecycle *lc, int ns, uint64_t o, cs_event *out)
{
    obj *x = find(stripe_of(lc, o), o, ns);
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

/* still alive at a normal exit, and nothing says it was meant to be */
static int leaked_at_exit(cs_lifecycle *lc, const obj *o)
{
    if (!o->key || o->state == CS_ST_RELEASED ||
        (o->flags & (OF_LEAK_REPORTED | OF_NULL_DELETER | OF_REACHABLE)))
        return 0; /* reachable: LeakSanitizer's "still reachable" */
    if (o->ns == CS_NS_NUMPY && kept_at_shutdown(lc, o->key))
        return 0; /* referenced by a consumer alive at shutdown */
    if (o->ns == CS_NS_DLPACK && o->state == CS_ST_CONSUMED && o->data &&
        kept_at_shutdown(lc, o->data))
        return 0; /* consumed by an array numpy kept alive through shutdown on
                   * purpose (its deleter ran after Python was gone): the same
                   * data, referenced at shutdown, not leaked */
    if (o->ns == CS_NS_NUMPY && o->nhist && (o->hist[0].flags & CS_EVF_IMPORT))
        return 0; /* module data, made by an import: referenced at shutdown */
    return 1;
}

/* released by a consumer that never renamed its capsule, which is still
 * alive at exit: its destructor will delete again at shutdown (R8) */
static int unrenamed_at_exit(const obj *o)
{
    return o->key && o->ns == CS_NS_DLPACK && o->state == CS_ST_RELEASED &&
           (o->flags & OF_UNRENAMED) && !(o->flags & OF_CAPSULE_DEAD);
}

typedef struct leak_ref {
    uint64_t time, key;
    int ns;
} leak_ref;

static int cmp_leak(const void *a, const void *b)
{
    const leak_ref *x = a, *y = b;
    if (x->time != y->time)
        return (x->time > y->time) - (x->time < y->time);
    if (x->ns != y->ns)
        return x->ns - y->ns;
    return (x->key > y->key) - (x->key < y->key);
}

/* Leaks are reported in the order their objects were made, whatever table
 * slot or stripe they sit in. */
int cs_lc_finish(cs_lifecycle *lc, int how)
{
    if (how != CS_END_EXIT)
        return 0;
    leak_ref *v = NULL;
    size_t nv = 0, cap = 0;
    for (int i = 0; i < NSTRIPES; i++) {
        stripe *st = &lc->s[i];
        lock_stripe(lc, st);
        for (size_t j = 0; j < st->cap; j++) {
            obj *o = &st->tab[j];
            if (!leaked_at_exit(lc, o) && !unrenamed_at_exit(o))
                continue;
            if (!room_for_one(&v, nv, &cap, sizeof *v))
                break;
            v[nv++] = (leak_ref){o->nhist ? o->hist[0].time_ns : 0, o->key, o->ns};
        }
        unlock_stripe(lc, st);
    }
    if (nv)
        qsort(v, nv, sizeof *v, cmp_leak);
    int n = 0;
    for (size_t i = 0; i < nv; i++) {
        stripe *st = stripe_of(lc, v[i].key);
        lock_stripe(lc, st);
        obj *o = find(st, v[i].key, v[i].ns);
        if (o && unrenamed_at_exit(o)) {
            not_renamed(lc, st, o, NULL, NULL);
            n++;
        } else if (o && leaked_at_exit(lc, o)) {
            o->flags |= OF_LEAK_REPORTED;
            if (o->ns == CS_NS_NUMPY)
                report(lc, NULL, CS_KIND_NUMPY_LEAK, o, NULL, 0, 0);
            else
                report(lc, NULL, CS_KIND_DLPACK_LEAK, o, NULL,
                       o->state == CS_ST_CONSUMED ? CS_LEAK_CONSUMED : CS_LEAK_NEVER_CONSUMED, 0);
            n++;
        }
        unlock_stripe(lc, st);
    }
    free(v);
    return n;
}

/* ---- words ---- */

const char *cs_event_name(const cs_event *ev)
{
    switch (ev->kind) {
    case CS_EV_EXPORT: return "export";
    case CS_EV_OWN: return "own";
    case CS_EV_CONSUME: return "consume";
    case CS_EV_GETPTR_USED:
    case CS_EV_GETPTR: return "reconsume";
    case CS_EV_NO_GIL: return "call";
    case CS_EV_DEVICE: return "alloc";
    case CS_EV_DELETE: return "delete";
    case CS_EV_DESTROY: return "destroy";
    case CS_EV_BAD_TENSOR: return "check";
    case CS_EV_NP_ALLOC: return "alloc";
    case CS_EV_NP_FREE: return "free";
    case CS_EV_NP_HANDLER: return "handler";
    case CS_EV_NP_FOREIGN_FREE: return "free";
    case CS_EV_NP_REACHABLE: return "reachable";
    }
    return "event";
}

const char *cs_event_phrase(const cs_finding *f, int i)
{
    const cs_event *ev = &f->events[i];
    int earlier = 0;
    for (int j = 0; j < i; j++)
        if (f->events[j].kind == ev->kind)
            earlier++;
    switch (ev->kind) {
    case CS_EV_EXPORT: return earlier ? "exported again at" : "exported at";
    case CS_EV_OWN: return "wrapped in numpy's numpy_dltensor capsule at";
    case CS_EV_CONSUME: return earlier ? "consumed again at" : "consumed at";
    case CS_EV_GETPTR_USED: return "pointer taken from the consumed capsule at";
    case CS_EV_GETPTR: return "pointer taken again at";
    case CS_EV_NO_GIL: return "called without the GIL at";
    case CS_EV_DEVICE: return "its data was allocated by that handler at";
    case CS_EV_DELETE:
        if (ev->flags & CS_EVF_SKIPPED)
            return "deleter call skipped (protect=1) at";
        if (ev->flags & CS_EVF_IN_DTOR)
            return earlier ? "deleted again by the capsule destructor at"
                           : "deleted by the capsule destructor at";
        return earlier ? "deleted again at" : "deleted at";
    case CS_EV_DESTROY: return "capsule destroyed at";
    case CS_EV_BAD_TENSOR: return "checked at";
    case CS_EV_NP_ALLOC: return "allocated at";
    case CS_EV_NP_FREE: return earlier ? "freed again at" : "freed at";
    case CS_EV_NP_HANDLER: return "handler installed at";
    case CS_EV_NP_FOREIGN_FREE: return "freed with libc free() by numpy at";
    }
    return "at";
}

const char *cs_finding_object_type(const cs_finding *f)
{
    switch (f->kind) {
    case CS_KIND_NUMPY_BAD_HANDLER: return "PyDataMem_Handler";
    case CS_KIND_NUMPY_LEAK:
    case CS_KIND_NUMPY_DOUBLE_FREE:
    case CS_KIND_NUMPY_FOREIGN_FREE:
    case CS_KIND_NUMPY_STALE_HANDLER:
    case CS_KIND_NUMPY_HANDLER_NO_GIL: return "numpy data";
    case CS_KIND_CAPSULE_NO_GIL:
    case CS_KIND_DLPACK_DELETER_NO_GIL: return "call site";
    }
    for (int i = 0; i < f->nevents; i++)
        if (f->events[i].kind == CS_EV_EXPORT)
            return (f->events[i].aux & CS_DLV_VERSIONED) ? "DLManagedTensorVersioned"
                                                          : "DLManagedTensor";
    return "DLManagedTensor";
}

static const char *bad_text(uint32_t d)
{
    switch (d) {
    case CS_BAD_NULL_POINTER: return "the capsule holds a NULL pointer (R1)";
    case CS_BAD_UNREADABLE: return "the capsule's pointer does not point to readable memory (R1)";
    case CS_BAD_UNREADABLE_SHAPE: return "shape does not point to readable memory (R15)";
    case CS_BAD_NDIM: return "ndim is negative or absurdly large (R15)";
    case CS_BAD_NULL_SHAPE: return "shape is NULL although ndim > 0 (R15)";
    case CS_BAD_NEGATIVE_SHAPE: return "shape has a negative extent (R15)";
    case CS_BAD_NULL_STRIDES_V12: return "strides is NULL in a version >= 1.2 tensor with ndim > 0 (R16)";
    case CS_BAD_DTYPE_CODE: return "dtype code is not a DLDataTypeCode (R18)";
    case CS_BAD_DTYPE_BITS: return "dtype bits is not a valid width for its code (R18)";
    case CS_BAD_DTYPE_LANES: return "dtype lanes is 0 (R18)";
    case CS_BAD_DEVICE_TYPE: return "device_type is not a DLDeviceType (R19)";
    case CS_BAD_DEVICE_ID: return "device_id is not 0 for CPU memory (R19)";
    case CS_BAD_VERSION_MAJOR: return "version.major is not 1 in a versioned capsule (R13)";
    case CS_BAD_FLAGS: return "flags has unknown bits (R21)";
    case CS_BAD_MUTATED: return "shape, strides or data changed while the tensor was on loan (R20)";
    case CS_BAD_RENAME: return "the capsule was renamed to a name other than used_dltensor (R7)";
    case CS_BAD_NULL_DATA: return "data is NULL although the tensor has elements (R17)";
    case CS_BAD_BOOL_BITS: return "bool dtype with bits != 8 (R18)";
    case CS_BAD_HANDLER_NAME: return "the handler capsule is not named 'mem_handler' (R27)";
    case CS_BAD_HANDLER_VERSION: return "the handler version is not 1 (R27)";
    case CS_BAD_HANDLER_NULL_FN: return "the handler has a NULL function (R27)";
    case CS_BAD_HANDLER_UNTERMINATED: return "the handler name is not NUL-terminated (R27)";
    }
    return "malformed";
}

const char *cs_finding_message(const cs_finding *f, char *buf, size_t n)
{
    const char *t = cs_finding_object_type(f);
    unsigned long long p = (unsigned long long)f->obj;
    switch (f->kind) {
    case CS_KIND_DLPACK_DOUBLE_DELETE:
        snprintf(buf, n, "deleter of %s 0x%llx called twice", t, p);
        break;
    case CS_KIND_DLPACK_UNCHECKED_DESTRUCTOR:
        snprintf(buf, n, "the producer's capsule destructor called the deleter of %s 0x%llx "
                 "although the capsule was consumed (renamed used_*): only the consumer may "
                 "release it; the destructor must check the capsule name", t, p);
        break;
    case CS_KIND_DLPACK_NOT_RENAMED:
        snprintf(buf, n, "the deleter of %s 0x%llx was called while its capsule is still "
                 "unconsumed: the producer's destructor will delete it again (a consumer must "
                 "rename the capsule to used_dltensor when it takes ownership)", t, p);
        break;
    case CS_KIND_DLPACK_RECONSUME:
        snprintf(buf, n, "%s 0x%llx consumed again after it was %s", t, p,
                 f->detail == CS_ST_RELEASED ? "released" : "consumed");
        break;
    case CS_KIND_DLPACK_LEAK:
        switch (f->detail) {
        case CS_LEAK_CONSUMED:
            snprintf(buf, n, "%s 0x%llx (%llu bytes) was consumed but its deleter was never "
                     "called", t, p, (unsigned long long)f->bytes);
            break;
        case CS_LEAK_NULL_DESTRUCTOR:
            snprintf(buf, n, "%s 0x%llx (%llu bytes) leaked: its capsule was created without a "
                     "destructor and died unconsumed", t, p, (unsigned long long)f->bytes);
            break;
        case CS_LEAK_NEVER_CONSUMED:
            snprintf(buf, n, "%s 0x%llx (%llu bytes) was exported and never consumed nor "
                     "released", t, p, (unsigned long long)f->bytes);
            break;
        default:
            snprintf(buf, n, "%s 0x%llx (%llu bytes) leaked: its capsule died unconsumed and "
                     "the destructor did not call the deleter", t, p, (unsigned long long)f->bytes);
        }
        break;
    case CS_KIND_DLPACK_NULL_DELETER:
        snprintf(buf, n, "%s 0x%llx exported with a NULL deleter: consumers must not call it, "
                 "and its memory must outlive every consumer", t, p);
        break;
    case CS_KIND_DLPACK_BAD_TENSOR:
        /* a missing pointer or a change has no offending value to show */
        if (f->detail == CS_BAD_NULL_SHAPE || f->detail == CS_BAD_NULL_STRIDES_V12 ||
            f->detail == CS_BAD_NULL_DATA || f->detail == CS_BAD_MUTATED || f->detail == CS_BAD_RENAME ||
            f->detail == CS_BAD_UNREADABLE || f->detail == CS_BAD_UNREADABLE_SHAPE)
            snprintf(buf, n, "%s 0x%llx: %s", t, p, bad_text(f->detail));
        else
            snprintf(buf, n, "%s 0x%llx: %s (value %lld)", t, p, bad_text(f->detail),
                     (long long)f->value);
        break;
    case CS_KIND_DLPACK_BYTE_OFFSET_IGNORED:
        snprintf(buf, n, "%s 0x%llx has byte_offset %llu but was consumed by a consumer that "
                 "ignores byte_offset (torch): it reads the wrong elements", t, p,
                 (unsigned long long)f->value);
        break;
    case CS_KIND_CAPSULE_NO_GIL:
        snprintf(buf, n, "a PyCapsule function was called without holding the GIL "
                 "(PyGILState_Check() == 0): take it with PyGILState_Ensure first");
        break;
    case CS_KIND_NUMPY_HANDLER_NO_GIL:
        snprintf(buf, n, "a NumPy allocation or free went through the memory handler without "
                 "the GIL (call site 0x%llx): numpy's default handler expects it held (R33)", p);
        break;
    case CS_KIND_DLPACK_DELETER_NO_GIL:
        snprintf(buf, n, "a DLPack deleter called without the GIL (as torch calls foreign "
                 "deleters) used the Python C API without PyGILState_Ensure (R12)");
        break;
    case CS_KIND_DLPACK_DEVICE_MISMATCH:
        snprintf(buf, n, "%s 0x%llx exports data 0x%llx as CPU memory, but the handler that "
                 "allocated it declared DLPack device type %u: consumers will treat it as "
                 "plain host memory", t, p, (unsigned long long)f->value, f->detail);
        break;
    case CS_KIND_NUMPY_LEAK:
        snprintf(buf, n, "%llu bytes of NumPy data at 0x%llx allocated and never freed",
                 (unsigned long long)f->bytes, p);
        break;
    case CS_KIND_NUMPY_DOUBLE_FREE:
        snprintf(buf, n, "NumPy data 0x%llx freed twice", p);
        break;
    case CS_KIND_NUMPY_FOREIGN_FREE:
        snprintf(buf, n, "NumPy freed 0x%llx, which no memory handler allocated: an array was "
                 "given NPY_ARRAY_OWNDATA on foreign memory (hand it over through a PyCapsule "
                 "base object instead)", p);
        break;
    case CS_KIND_NUMPY_STALE_HANDLER:
        snprintf(buf, n, "%llu bytes of NumPy data at 0x%llx freed through memory handler 0x%llx, %s",
                 (unsigned long long)f->bytes, p, (unsigned long long)f->value,
                 f->detail == CS_STALE_CHANGED ? "whose struct changed or was freed since it was "
                                                 "installed (a handler must be immortal)"
                 : f->detail == CS_STALE_UNLOADED ? "whose functions are no longer in a loaded "
                                                    "object (dlclose)"
                 : f->detail == CS_STALE_CTX_FREED ? "whose ctx was freed while its blocks were "
                                                     "alive (free() of allocator.ctx)"
                                                   : "which is not the handler that allocated it");
        break;
    case CS_KIND_NUMPY_BAD_HANDLER:
        snprintf(buf, n, "invalid NumPy memory handler at 0x%llx: %s", p, bad_text(f->detail));
        break;
    default:
        snprintf(buf, n, "%s 0x%llx", cs_kind_name(f->kind), p);
    }
    return buf;
}
