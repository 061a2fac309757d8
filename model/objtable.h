/* The object table behind the lifecycle (lifecycle.c judges, this keeps):
 * objects keyed by (namespace, address) in NSTRIPES open-addressing
 * tables, each with its lock, its tombstone FIFO and its share of the live
 * totals; each object's bounded history, and the write-behind that sends
 * a history to the sink once the object has a finding. Internal to
 * objtable.c and lifecycle.c. */
#ifndef CAPSAN_OBJTABLE_H
#define CAPSAN_OBJTABLE_H

#include <stdatomic.h>

#include "lifecycle.h"
#include "spin.h"

#define NSTRIPES 64
#define TOMB_PER_STRIPE 128

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
#define OF_DATA_FREED 0x800  /* dlpack-data-freed already reported */
#define OF_DROPPED 0x1000   /* never consumed, and its deleter freed nothing when it ran
                              * during interpreter shutdown: leaked (judged at exit) */
#define OF_XAPI 0x2000      /* born through the exchange API: no capsule (R50-R56) */
#define OF_REENTERED 0x8000 /* dlpack-destructor-reentered already reported */
#define OF_CLOBBERED 0x20000  /* dlpack-error-clobbered already reported */
#define OF_OFFSET_DROPPED 0x40000 /* a re-export without its byte_offset already reported */
#define OF_WRONG_NAME 0x10000 /* its consumer renamed it to the other version's used_* name
                               * (R8): the producer's destructor will release it */
#define OF_VIEW_KEPT 0x80000 /* a view whose caller kept its DLTensor past the call */
#define OF_PY_HELD 0x100000  /* with OF_REACHABLE: reached from Python at atexit, and alive
                              * after finalization (which a leak that holds it explains) */
#define OF_STALE_TOLD 0x200000 /* numpy-stale-handler already reported (its handler died) */
#define OF_VIEW 0x4000      /* a non-owning exchange-API view: never a leak (R53) */
#define OF_UNRENAMED 0x400   /* released while its capsule still had the unconsumed name:
                              * dlpack-not-renamed unless the consumer renames it next */

typedef struct obj {
    uint64_t key;      /* address; 0 = empty slot */
    uint32_t gen;      /* bumped on reuse, matches tombstone FIFO entries */
    uint8_t ns;
    uint8_t state;     /* cs_obj_state */
    uint8_t nhist;
    uint8_t nflushed;  /* history events already given to the sink */
    uint32_t flags;    /* OF_* */
    uint32_t slot;     /* its live-state slot (cs_lc_live_put), 0 = none */
    uint64_t capsule;  /* the exporting capsule */
    uint64_t data;     /* DLPack: dl_tensor.data as consumed (0 if not known) */
    uint64_t bytes;
    cs_event *hist;    /* up to CS_FINDING_MAX_EVENTS - 1 events, cs_malloc'd */
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
    int64_t born[3];       /* and of its births, by namespace (views excluded; Arrow:
                            * its exports, stream chunks included) */
    uint32_t gen;          /* generations of this stripe's objects (under mu) */
    cs_event wrap;         /* the NP_WRAP just emitted for the NP_FOREIGN_FREE that
                            * follows it on the same thread (kind 0: none) */
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
    uint64_t born_ns;  /* cs_lc_set_born */
    /* the indirect leaks of the next ot_report (cs_lc_finish), or NULL */
    const cs_finding *indirect;
    stripe s[NSTRIPES];
};

/* table index: a multiply, its high bits folded down (heap addresses have
 * zero low bits, which a product alone keeps in its low bits) */
static inline uint64_t ot_mix(uint64_t k, int ns)
{
    k = (k ^ (uint64_t)ns) * 0x9e3779b97f4a7c15ull;
    return k ^ (k >> 29);
}

static inline stripe *ot_stripe_of(cs_lifecycle *lc, uint64_t obj)
{
    /* the top bits of another product (Fibonacci hashing); both namespaces
     * of one address share a stripe: one lock covers both */
    _Static_assert(NSTRIPES == 64, "6 bits of stripe");
    return &lc->s[((obj >> 4) * 0xff51afd7ed558ccdull) >> 58];
}

/* One judgement: did the current event reach the sink? */
typedef struct judge {
    const cs_event *cur;
    int in_hist;   /* cur was appended to its object's history */
    int written;   /* cur went to the sink */
} judge;

/* the object's entry, or NULL (a tombstone is an entry too) */
static inline obj *ot_find(stripe *st, uint64_t key, int ns)
{
    if (!st->cap)
        return NULL;
    size_t m = st->cap - 1;
    for (size_t i = ot_mix(key, ns) & m;; i = (i + 1) & m) {
        obj *o = &st->tab[i];
        if (!o->key)
            return NULL;
        if (o->key == key && o->ns == ns)
            return o;
    }
}

/* A new entry (after ot_find said there is none), or NULL out of memory. */
obj *ot_insert(stripe *st, uint64_t key, int ns);
/* Start o's life again: a new generation, state CREATED, no history. */
void ot_reset(stripe *st, obj *o);
/* Append ev to o's history (the first events and the latest are kept). */
void ot_hist_add(stripe *st, obj *o, const cs_event *ev, judge *j);
/* A finding about o (or, with o == NULL, about ev->obj): its history and
 * ev reach the sink first, then the callback. */
void ot_report(cs_lifecycle *lc, judge *j, int kind, obj *o, const cs_event *ev,
               uint32_t detail, uint64_t value);
/* o's history goes to the sink now, and its later events as they happen
 * (an object a finding is about, though the finding is another's) */
void ot_trace(cs_lifecycle *lc, obj *o);
/* o counts in the live totals from creation (+1) to release (-1). */
void ot_count(stripe *st, const obj *o, int sign);
/* one more birth in namespace ns (under the stripe's lock) */
static inline void ot_born(stripe *st, int ns)
{
    /* one writer (the stripe's lock holder); relaxed stores for readers */
    __atomic_store_n(&st->born[ns], st->born[ns] + 1, __ATOMIC_RELAXED);
}
/* o is released: a tombstone, the stripe's oldest forgotten when full.
 * o may move in the table: look it up again afterwards. */
void ot_entomb(stripe *st, obj *o);
/* data a deleter let go of during interpreter shutdown (numpy keeps its
 * array alive then), and whether such data lies in [lo, hi) (a view's
 * data lies inside its block) */
void ot_keep_at_shutdown(cs_lifecycle *lc, uint64_t data);
int ot_kept_at_shutdown(cs_lifecycle *lc, uint64_t lo, uint64_t hi);
/* a NumPy block's bytes, as a range (a 0-byte block has its first) */
static inline uint64_t ot_block_end(const obj *o) { return o->key + (o->bytes ? o->bytes : 1); }
/* a stripe's lock (elided while one thread judges alone) */
void ot_lock(cs_lifecycle *lc, stripe *st);
void ot_unlock(cs_lifecycle *lc, stripe *st);
/* fn on every live (created or consumed), unreported object of namespace
 * ns, its stripe locked */
void ot_each_live(cs_lifecycle *lc, int ns, void (*fn)(cs_lifecycle *, obj *, void *), void *ud);
/* The keys of namespace ns's consumed objects that keep(o, since_ns)
 * accepts, sorted, in *out (cs_malloc'd; the caller cs_frees it): a scope's
 * leak candidates (verdicts.c) */
size_t ot_owned_since(cs_lifecycle *lc, int ns, int (*keep)(const obj *o, uint64_t since_ns),
                      uint64_t since_ns, uint64_t **out);
/* Room for one more element of size elem in *v (n used of *cap); 0 when
 * out of memory. */
int ot_room_for_one(void *v, size_t n, size_t *cap, size_t elem);
/* qsort/bsearch order of uint64_t keys */
int ot_cmp_u64(const void *a, const void *b);
/* the keys of a namespace's live objects that keep(o, ud) accepts (all of
 * them when keep is NULL), sorted, into a cs_malloc'd *out; returns how many */
size_t ot_live_keys(cs_lifecycle *lc, int ns, int (*keep)(const obj *, void *), void *ud,
                    uint64_t **out);

#endif
