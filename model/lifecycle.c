/* Events -> findings: the DLPack state machine (CREATED -> CONSUMED ->
 * RELEASED, rulebook R3..R21), NumPy block pairing (R29), and the leak
 * verdicts at the end. The objects themselves are kept by objtable.c.
 *
 * Released objects stay as tombstones so that a repeated delete or free is
 * recognised; each stripe keeps at most TOMB_PER_STRIPE of them, a bound
 * shared by the runtime and the reader so both judge alike. */
#include "lifecycle.h"
#include "objtable.h"

#include <stdlib.h>
#include <string.h>

/* ---- DLPack ---- */

/* A consumer released the tensor and left its capsule unconsumed, and the
 * capsule was used after that (its destructor deleting again, a read, its
 * death): dlpack-not-renamed, once, with ev as the evidence. */
static void not_renamed(cs_lifecycle *lc, stripe *st, obj *o, const cs_event *ev, judge *j)
{
    o->flags &= (uint16_t)~OF_UNRENAMED;
    o->flags |= OF_NOT_RENAMED;
    if (ev)
        ot_hist_add(st, o, ev, j);
    ot_report(lc, j, CS_KIND_DLPACK_NOT_RENAMED, o, NULL, 0, 0);
}

static int ever_consumed(const obj *o)
{
    if (o->flags & (OF_CAPSULE_USED | OF_XAPI))
        return 1;
    for (unsigned i = 0; i < o->nhist; i++)
        if (o->hist[i].kind == CS_EV_CONSUME)
            return 1;
    return 0;
}

/* ---- DLPack 1.3's exchange API (R50-R56): tensors without a capsule ---- */

/* A birth through the exchange table. from_py and the allocator hand the
 * caller an owning tensor, and a view is the caller's while its call
 * lasts: consumed from birth, data watched (R51, R53, R54). A struct the
 * caller gave to_py is consumed by to_py's library when it was taken
 * (HANDED), else its caller still owns it (R52). No capsule follows. */
static void exchange_birth(stripe *st, obj *o, const cs_event *ev, judge *j)
{
    if (o && o->state != CS_ST_RELEASED)
        ot_count(st, o, -1); /* a live struct born again: the old one went unseen */
    if (!o && !(o = ot_insert(st, ev->obj, CS_NS_DLPACK)))
        return;
    ot_reset(st, o);
    o->bytes = ev->c;
    o->flags |= OF_XAPI | OF_CAPSULE_DEAD | OF_VERSIONED;
    if (ev->aux & CS_DLV_XVIEW)
        o->flags |= OF_VIEW;
    if (ev->flags & CS_EVF_NULL_DELETER)
        o->flags |= OF_NULL_DELETER;
    ot_count(st, o, 1);
    ot_hist_add(st, o, ev, j);
    if ((ev->aux & CS_DLV_XTO) && !(ev->aux & CS_DLV_HANDED))
        return; /* to_py failed: its caller's, to delete */
    o->state = CS_ST_CONSUMED;
    o->data = ev->a;
    if (o->data && cs_lc_data_watch)
        cs_lc_data_watch(o->data, o->bytes, 1);
    if (o->slot && cs_lc_live_consumed)
        cs_lc_live_consumed(o->slot, ev->stack);
}

/* A live tensor handed to to_py, which took it: its owner is now to_py's
 * library (R52). A released one handed over is used after its release. */
static void exchange_handover(cs_lifecycle *lc, stripe *st, obj *o, const cs_event *ev, judge *j)
{
    if (!o)
        return; /* made before capsan started */
    if (o->state == CS_ST_RELEASED) {
        ot_report(lc, j, CS_KIND_DLPACK_RECONSUME, o, ev, o->state, 0);
        ot_hist_add(st, o, ev, j);
        return;
    }
    o->state = CS_ST_CONSUMED;
    ot_hist_add(st, o, ev, j);
}

/* A broken calling contract (R51, R52, R54-R56) or a bad table (R50). The
 * finding's value: the entry in the low byte, the evidence above it. */
static void exchange_check(cs_lifecycle *lc, stripe *st, obj *o, const cs_event *ev, judge *j)
{
    int table = ev->aux >= CS_XC_TABLE_FIRST;
    uint64_t value = (ev->b << 8) | (ev->extra & 0xff);
    int kind = table ? CS_KIND_DLPACK_BAD_EXCHANGE_TABLE : CS_KIND_DLPACK_EXCHANGE_CONTRACT;
    if (!table && o && o->nhist && ev->aux == CS_XC_TO_PY_RELEASED) {
        /* about the tensor to_py released: its history says so */
        ot_report(lc, j, kind, o, ev, ev->aux, value);
        ot_hist_add(st, o, ev, j);
        return;
    }
    obj tmp = {.key = ev->obj};
    ot_report(lc, j, kind, &tmp, ev, ev->aux, value);
}

static unsigned dlpack_event(cs_lifecycle *lc, stripe *st, obj *o, const cs_event *ev, judge *j)
{
    unsigned verdict = 0;

    switch (ev->kind) {
    case CS_EV_XHANDOVER:
        exchange_handover(lc, st, o, ev, j);
        return 0;

    case CS_EV_XCHECK:
        exchange_check(lc, st, o, ev, j);
        return 0;

    case CS_EV_EXPORT:
        if (ev->aux & CS_DLV_X) {
            exchange_birth(st, o, ev, j);
            return 0;
        }
        if (o && (o->state == CS_ST_CREATED || o->state == CS_ST_CONSUMED) &&
            (o->flags & OF_NULL_DELETER) && (ev->flags & CS_EVF_NULL_DELETER)) {
            /* a static struct without a deleter, lent again: each export
             * is a new loan (nobody ever releases it) */
            ot_count(st, o, -1);
        } else if (o && (o->state == CS_ST_CREATED || o->state == CS_ST_CONSUMED)) {
            /* the same live struct in a second capsule: judge the newest */
            ot_hist_add(st, o, ev, j);
            o->capsule = ev->a;
            o->flags &= (uint16_t)~(OF_CAPSULE_DEAD | OF_CAPSULE_USED);
            return 0;
        }
        if (!o && !(o = ot_insert(st, ev->obj, CS_NS_DLPACK)))
            return 0;
        ot_reset(st, o);
        o->capsule = ev->a;
        o->bytes = ev->c;
        ot_count(st, o, 1);
        if (ev->aux & CS_DLV_VERSIONED)
            o->flags |= OF_VERSIONED;
        if (ev->flags & CS_EVF_NULL_DELETER)
            o->flags |= OF_NULL_DELETER;
        /* a NULL deleter is legal (R10): only a consumer that calls it errs */
        ot_hist_add(st, o, ev, j);
        return 0;

    case CS_EV_BAD_TENSOR:
        if (o) {
            /* a change made before the consume is seen again at the delete */
            if (ev->extra == CS_BAD_MUTATED) {
                if (o->flags & OF_MUTATED)
                    return 0;
                o->flags |= OF_MUTATED;
            }
            ot_report(lc, j, CS_KIND_DLPACK_BAD_TENSOR, o, ev, ev->extra, ev->b);
        } else {
            obj tmp = {.key = ev->obj};
            ot_report(lc, j, CS_KIND_DLPACK_BAD_TENSOR, &tmp, ev, ev->extra, ev->b);
        }
        return 0;

    case CS_EV_OWN:
        if (o && o->state != CS_ST_RELEASED)
            ot_hist_add(st, o, ev, j);
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
            ot_hist_add(st, o, ev, j);
            return CS_VERDICT_LATE_RENAME;
        }
        if (o->state == CS_ST_CREATED) {
            o->state = CS_ST_CONSUMED;
            if (!(ev->flags & CS_EVF_OFFSET_IGNORED))
                o->data = ev->c;
            if (o->data && cs_lc_data_watch)
                cs_lc_data_watch(o->data, o->bytes, 1);
            if (ev->a == o->capsule)
                o->flags |= OF_CAPSULE_USED;
            if (o->slot && cs_lc_live_consumed)
                cs_lc_live_consumed(o->slot, ev->stack);
            ot_hist_add(st, o, ev, j);
            if (ev->flags & CS_EVF_OFFSET_IGNORED)
                ot_report(lc, j, CS_KIND_DLPACK_BYTE_OFFSET_IGNORED, o, NULL, 0, ev->c);
        } else {
            ot_report(lc, j, CS_KIND_DLPACK_RECONSUME, o, ev, o->state, 0);
            ot_hist_add(st, o, ev, j);
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
            ot_report(lc, j, CS_KIND_DLPACK_RECONSUME, o, ev, o->state, 0);
            ot_hist_add(st, o, ev, j);
        }
        return 0;

    case CS_EV_DELETE: {
        if (!o)
            return 0;
        if (ev->aux == CS_DELETE_VIEW_END) {
            /* a view's caller returned: its memory is the producer's again */
            if ((o->flags & OF_VIEW) && o->state == CS_ST_CONSUMED) {
                ot_hist_add(st, o, ev, j);
                ot_entomb(st, o);
            }
            return 0;
        }
        if ((ev->flags & CS_EVF_NO_PYTHON) && ev->c)
            ot_keep_at_shutdown(lc, ev->c);
        if (ev->aux == CS_DELETE_NULL_CALL) {
            /* a consumer jumped through the NULL deleter (R10): the crash
             * that follows is this tensor's */
            ot_hist_add(st, o, ev, j);
            ot_report(lc, j, CS_KIND_DLPACK_NULL_DELETER, o, NULL, 0, 0);
            return 0;
        }
        int in_own_dtor = (ev->flags & CS_EVF_IN_DTOR) && ev->a == o->capsule;
        switch (o->state) {
        case CS_ST_CREATED:
            ot_hist_add(st, o, ev, j);
            ot_entomb(st, o);
            if (!in_own_dtor && !(o->flags & OF_CAPSULE_DEAD)) {
                /* the capsule still says "dltensor" (R8): judged by what
                 * comes next. A rename now is a late one (JAX renames just
                 * after a copy released the tensor); the destructor
                 * deleting again, a read through the capsule, or its death
                 * with the unconsumed name is dlpack-not-renamed */
                o = ot_find(st, ev->obj, CS_NS_DLPACK); /* entomb may move it */
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
                    ot_report(lc, j, CS_KIND_DLPACK_UNCHECKED_DESTRUCTOR, o, ev, 0, 0);
                }
                ot_hist_add(st, o, ev, j);
                /* unprotected, the call runs and releases the tensor; the
                 * consumer's own delete later is the double free this
                 * finding already explains */
                if (!lc->protect)
                    ot_entomb(st, o);
                return CS_VERDICT_SKIP;
            }
            ot_hist_add(st, o, ev, j);
            ot_entomb(st, o);
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
                /* the double delete that dlpack-not-renamed predicted, once
                 * that finding was made by something else (a read through
                 * the capsule): reported before it runs, naming its cause */
                ot_report(lc, j, CS_KIND_DLPACK_DOUBLE_DELETE, o, ev, CS_KIND_DLPACK_NOT_RENAMED, 0);
                ot_hist_add(st, o, ev, j);
                return verdict;
            }
            if ((o->flags & OF_UNCHECKED) && !in_own_dtor) {
                /* the consumer's delete after a producer's destructor
                 * released its tensor: the double delete that
                 * dlpack-unchecked-destructor caused, reported before it runs */
                ot_report(lc, j, CS_KIND_DLPACK_DOUBLE_DELETE, o, ev,
                          CS_KIND_DLPACK_UNCHECKED_DESTRUCTOR, 0);
                ot_hist_add(st, o, ev, j);
                return verdict;
            }
            if (in_own_dtor && (o->flags & OF_CAPSULE_USED)) {
                if (!(o->flags & OF_UNCHECKED)) {
                    o->flags |= OF_UNCHECKED;
                    ot_report(lc, j, CS_KIND_DLPACK_UNCHECKED_DESTRUCTOR, o, ev, 0, 0);
                }
                ot_hist_add(st, o, ev, j);
                return verdict;
            }
            ot_report(lc, j, CS_KIND_DLPACK_DOUBLE_DELETE, o, ev, 0, 0);
            ot_hist_add(st, o, ev, j);
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
        ot_report(lc, j, kind, &tmp, ev, ev->aux, ev->a);
        return 0;
    }

    case CS_EV_DATA_FREED:
        /* the producer freed what the consumer still reads (once a tensor) */
        if (o && o->state == CS_ST_CONSUMED && !(o->flags & OF_DATA_FREED)) {
            o->flags |= OF_DATA_FREED;
            /* a view's memory, freed while its caller still runs (R53) */
            ot_report(lc, j, (o->flags & OF_VIEW) ? CS_KIND_DLPACK_STALE_VIEW : CS_KIND_DLPACK_DATA_FREED,
                      o, ev, ev->aux, ev->a);
            ot_hist_add(st, o, ev, j);
        }
        return 0;

    case CS_EV_REACHABLE:
        /* kept in the history: a replay of a live-at-exit finding must
         * know why it was not a leak */
        if (o && o->state != CS_ST_RELEASED) {
            o->flags |= OF_REACHABLE;
            ot_hist_add(st, o, ev, j);
        }
        return 0;

    case CS_EV_DROPPED:
        /* released during interpreter shutdown by a deleter that freed
         * nothing. A tensor its consumer held and let go of then stays
         * clean (numpy keeps such an array alive on purpose, PR 22510);
         * one nobody ever consumed was only dropped: leaked, judged at exit */
        if (o && o->state == CS_ST_RELEASED && !ever_consumed(o) &&
            !(o->flags & (OF_LEAK_REPORTED | OF_NULL_DELETER | OF_DROPPED))) {
            ot_hist_add(st, o, ev, j);
            o->flags |= OF_DROPPED;
            o->data = ev->c;
            o->gen = ++st->gen; /* out of the tombstone FIFO until the exit verdict */
        }
        return 0;

    case CS_EV_DEVICE:
        if (o) {
            ot_hist_add(st, o, ev, j);
            ot_report(lc, j, CS_KIND_DLPACK_DEVICE_MISMATCH, o, NULL, ev->aux, ev->b);
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
            ot_hist_add(st, o, ev, j);
            ot_entomb(st, o);
            return 0;
        }
        if (o->state == CS_ST_CREATED && !(o->flags & (OF_LEAK_REPORTED | OF_NULL_DELETER))) {
            /* R3: an unconsumed capsule died and nobody released the tensor */
            ot_hist_add(st, o, ev, j);
            o->flags |= OF_LEAK_REPORTED;
            ot_report(lc, j, CS_KIND_DLPACK_LEAK, o, NULL,
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
            ot_count(st, o, -1); /* a missed free: the old block is gone */
        if (!o && !(o = ot_insert(st, ev->obj, CS_NS_NUMPY)))
            return 0;
        ot_reset(st, o);
        o->bytes = ev->a;
        ot_count(st, o, 1);
        ot_hist_add(st, o, ev, j);
        return 0;
    case CS_EV_NP_FREE:
        if (!ev->obj)
            return 0; /* R29: free(NULL, n) from sort is legal */
        if (o && o->state == CS_ST_CREATED) {
            uint32_t stale = ev->extra;
            if (!stale && o->nhist && o->hist[0].c && ev->c && o->hist[0].c != ev->c)
                stale = CS_STALE_OTHER;
            ot_hist_add(st, o, ev, j);
            if (stale)
                ot_report(lc, j, CS_KIND_NUMPY_STALE_HANDLER, o, NULL, stale, ev->c);
            ot_entomb(st, o);
        } else if (o && o->state == CS_ST_RELEASED && ev->c) {
            /* a legacy PyDataMem_FREE (c == 0) may free a block that came
             * back out of numpy's small-block cache unseen: not judged */
            ot_report(lc, j, CS_KIND_NUMPY_DOUBLE_FREE, o, ev, 0, 0);
            ot_hist_add(st, o, ev, j);
        }
        /* an unknown block may predate capsan (import capsan starts late) */
        return 0;
    case CS_EV_NP_WRAP:
        st->wrap = *ev; /* told with the free that follows */
        return 0;
    case CS_EV_NP_FOREIGN_FREE: {
        /* where an extension made an array around this memory, if known */
        cs_event wrap = st->wrap;
        int wrapped = wrap.kind && wrap.obj == ev->obj && wrap.thread == ev->thread;
        st->wrap.kind = 0;
        if (o && wrapped)
            ot_hist_add(st, o, &wrap, j);
        if (o && o->state == CS_ST_CREATED) {
            ot_hist_add(st, o, ev, j);
            ot_report(lc, j, CS_KIND_NUMPY_FOREIGN_FREE, o, NULL, 0, 0);
            ot_entomb(st, o);
        } else if (o && o->state == CS_ST_RELEASED) {
            /* an OWNDATA alias of a block its handler freed already (the
             * array that owned it died first): numpy frees it again */
            ot_report(lc, j, CS_KIND_NUMPY_DOUBLE_FREE, o, ev, 0, 0);
            ot_hist_add(st, o, ev, j);
        } else {
            obj tmp = {.key = ev->obj, .hist = &wrap, .nhist = (uint8_t)wrapped};
            ot_report(lc, j, CS_KIND_NUMPY_FOREIGN_FREE, &tmp, ev, 0, 0);
        }
        return 0;
    }
    case CS_EV_NP_REACHABLE:
        if (o && o->state == CS_ST_CREATED) {
            o->flags |= OF_REACHABLE;
            ot_hist_add(st, o, ev, j);
        }
        return 0;
    case CS_EV_NP_HANDLER:
        if (ev->extra) {
            obj tmp = {.key = ev->obj};
            ot_report(lc, j, CS_KIND_NUMPY_BAD_HANDLER, &tmp, ev, ev->extra, ev->b);
        }
        return 0;
    }
    return 0;
}

/* With protect=1, a delete that will be judged skippable is not run: the
 * copy that reaches the trace says so (the runtime marks its own copy). */
static int delete_will_skip(stripe *st, const cs_event *ev)
{
    const obj *o = ot_find(st, ev->obj, CS_NS_DLPACK);
    if (!o)
        return 0;
    int in_own_dtor = (ev->flags & CS_EVF_IN_DTOR) && ev->a == o->capsule;
    return o->state == CS_ST_RELEASED || (o->state == CS_ST_CONSUMED && in_own_dtor);
}

unsigned cs_lc_judge(cs_lifecycle *lc, const cs_event *ev, cs_event *origin, int *found)
{
    stripe *st = ot_stripe_of(lc, ev->obj);
    st->nevents++;
    cs_event marked;
    if (lc->protect && lc->sink && ev->kind == CS_EV_DELETE && delete_will_skip(st, ev)) {
        marked = *ev;
        marked.flags |= CS_EVF_SKIPPED;
        ev = &marked;
    }
    judge j = {ev, 0, 0};
    int ns = ev->kind >= CS_EV_NP_ALLOC ? CS_NS_NUMPY : CS_NS_DLPACK;
    obj *o = ot_find(st, ev->obj, ns);
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
        o = ot_find(st, ev->obj, ns);
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
    ot_report(lc, NULL, o->ns == CS_NS_NUMPY ? CS_KIND_NUMPY_LEAK : CS_KIND_DLPACK_LEAK, o, NULL, 0,
           0);
    r->n++;
}

int cs_lc_report_live(cs_lifecycle *lc, int ns, uint64_t origin_c)
{
    live_report r = {origin_c, 0};
    ot_each_live(lc, ns, report_if_from, &r);
    return r.n;
}

/* still alive at a normal exit, and nothing says it was meant to be */
static int leaked_at_exit(cs_lifecycle *lc, const obj *o)
{
    if (!o->key || o->state == CS_ST_RELEASED ||
        (o->flags & (OF_LEAK_REPORTED | OF_NULL_DELETER | OF_REACHABLE | OF_VIEW)))
        return 0; /* reachable: LeakSanitizer's "still reachable" */
    if (o->ns == CS_NS_NUMPY && ot_kept_at_shutdown(lc, o->key))
        return 0; /* referenced by a consumer alive at shutdown */
    if (o->ns == CS_NS_DLPACK && o->state == CS_ST_CONSUMED && o->data &&
        ot_kept_at_shutdown(lc, o->data))
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

/* exported, never consumed, and dropped at shutdown (CS_EV_DROPPED) */
static int dropped_at_exit(const obj *o)
{
    return o->key && o->ns == CS_NS_DLPACK && (o->flags & OF_DROPPED) &&
           !(o->flags & OF_LEAK_REPORTED);
}

/* a live block only a shutdown deleter kept: no leak of its own, but the
 * indirect part of a dropped tensor whose data it holds */
static int kept_block(cs_lifecycle *lc, const obj *o)
{
    return o->key && o->ns == CS_NS_NUMPY && o->state == CS_ST_CREATED &&
           !(o->flags & (OF_LEAK_REPORTED | OF_REACHABLE)) && ot_kept_at_shutdown(lc, o->key);
}

typedef struct leak_ref {
    uint64_t time, key;
    uint64_t lo, hi;  /* NumPy: the block; DLPack: the data it lends, if known */
    int ns;
    int what;         /* 0 a leak, 1 unrenamed, 2 only if it is someone's indirect,
                       * 3 live at _exit (reachable) unless it is someone's indirect */
    long root;        /* NumPy: the leaked tensor whose data lies in it, or -1 */
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

static int cmp_u64_key(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return (x > y) - (x < y);
}

static int cmp_root(const void *a, const void *b)
{
    const leak_ref *const *x = a, *const *y = b;
    return ((*x)->lo > (*y)->lo) - ((*x)->lo < (*y)->lo);
}

/* Each NumPy block that a leaked tensor's data lies in is that tensor's
 * indirect leak (a consumer that never deleted a numpy export leaks the
 * struct and, through manager_ctx, the array): v[i].root = the tensor. */
static void link_indirect(leak_ref *v, size_t nv)
{
    size_t nr = 0;
    for (size_t i = 0; i < nv; i++)
        nr += v[i].ns == CS_NS_DLPACK && v[i].what == 0 && v[i].lo;
    leak_ref **r = nr ? malloc(nr * sizeof *r) : NULL;
    if (!r)
        return;
    nr = 0;
    for (size_t i = 0; i < nv; i++)
        if (v[i].ns == CS_NS_DLPACK && v[i].what == 0 && v[i].lo)
            r[nr++] = &v[i];
    qsort(r, nr, sizeof *r, cmp_root);
    for (size_t i = 0; i < nv; i++) {
        if (v[i].ns != CS_NS_NUMPY)
            continue;
        size_t lo = 0, hi = nr; /* the first root whose data is >= the block */
        while (lo < hi) {
            size_t mid = lo + (hi - lo) / 2;
            if (r[mid]->lo < v[i].lo)
                lo = mid + 1;
            else
                hi = mid;
        }
        if (lo < nr && r[lo]->lo < v[i].hi)
            v[i].root = r[lo] - v;
    }
    free(r);
}

/* A tensor's dlpack-leak, with what only it keeps alive (ind) */
static void report_tensor_leak(cs_lifecycle *lc, obj *o, uint32_t detail, const cs_finding *ind)
{
    lc->indirect = ind->nindirect ? ind : NULL;
    ot_report(lc, NULL, CS_KIND_DLPACK_LEAK, o, NULL, detail, 0);
    lc->indirect = NULL;
}

/* The indirect part of root v[ri]: each block is traced (its history goes
 * to the sink, so a replay links it the same way) and not reported again. */
static void gather_indirect(cs_lifecycle *lc, leak_ref *v, size_t nv, size_t ri, cs_finding *ind)
{
    memset(ind, 0, sizeof *ind);
    for (size_t i = 0; i < nv; i++) {
        if (v[i].root != (long)ri)
            continue;
        stripe *st = ot_stripe_of(lc, v[i].key);
        ot_lock(lc, st);
        obj *o = ot_find(st, v[i].key, v[i].ns);
        if (o && o->state == CS_ST_CREATED && !(o->flags & OF_LEAK_REPORTED)) {
            o->flags |= OF_LEAK_REPORTED;
            ot_trace(lc, o);
            if (ind->nindirect < CS_FINDING_MAX_INDIRECT)
                ind->indirect[ind->nindirect] = (cs_indirect){
                    .kind = CS_KIND_NUMPY_LEAK, .obj = o->key, .bytes = o->bytes,
                    .alloc = o->nhist ? o->hist[0] : (cs_event){0}};
            ind->nindirect++;
            ind->indirect_bytes += o->bytes;
        }
        ot_unlock(lc, st);
    }
}

/* at _exit: what is still alive and was made by the program (not by an
 * import: module data), or released by nobody who could */
static int live_at_quick_exit(const obj *o)
{
    return o->key && (o->state == CS_ST_CREATED || o->state == CS_ST_CONSUMED) &&
           !(o->flags & (OF_LEAK_REPORTED | OF_NULL_DELETER | OF_VIEW)) &&
           !(o->ns == CS_NS_NUMPY && o->nhist && (o->hist[0].flags & CS_EVF_IMPORT));
}

static int what_at_end(cs_lifecycle *lc, const obj *o, int how)
{
    if (how == CS_END_QUICK_EXIT) {
        if (!live_at_quick_exit(o) || (o->nhist && o->hist[0].time_ns < lc->born_ns))
            return -1; /* or inherited from the parent this process forked from */
        return (o->flags & OF_REACHABLE) ? 3 : 0;
    }
    return leaked_at_exit(lc, o) || dropped_at_exit(o) ? 0
         : unrenamed_at_exit(o)                       ? 1
         : kept_block(lc, o)                          ? 2
                                                      : -1;
}

/* Leaks are reported in the order their objects were made, whatever table
 * slot or stripe they sit in. */
int cs_lc_finish(cs_lifecycle *lc, int how)
{
    if (how != CS_END_EXIT && how != CS_END_QUICK_EXIT)
        return 0;
    leak_ref *v = NULL;
    size_t nv = 0, cap = 0;
    for (int i = 0; i < NSTRIPES; i++) {
        stripe *st = &lc->s[i];
        ot_lock(lc, st);
        for (size_t j = 0; j < st->cap; j++) {
            obj *o = &st->tab[j];
            int what = what_at_end(lc, o, how);
            if (what < 0)
                continue;
            if (!ot_room_for_one(&v, nv, &cap, sizeof *v))
                break;
            leak_ref r = {o->nhist ? o->hist[0].time_ns : 0, o->key, 0, 0, o->ns, what, -1};
            if (o->ns == CS_NS_NUMPY) {
                r.lo = o->key;
                r.hi = o->key + (o->bytes ? o->bytes : 1);
            } else {
                r.lo = o->data;
            }
            v[nv++] = r;
        }
        ot_unlock(lc, st);
    }
    if (nv)
        qsort(v, nv, sizeof *v, cmp_leak);
    link_indirect(v, nv);
    int n = 0;
    for (size_t i = 0; i < nv; i++) {
        if (v[i].root >= 0 || v[i].what == 2)
            continue; /* someone's indirect part, or no leak of its own */
        cs_finding ind;
        if (v[i].ns == CS_NS_DLPACK && v[i].what == 0)
            gather_indirect(lc, v, nv, i, &ind);
        stripe *st = ot_stripe_of(lc, v[i].key);
        ot_lock(lc, st);
        obj *o = ot_find(st, v[i].key, v[i].ns);
        int what = o ? what_at_end(lc, o, how) : -1;
        if (what == 3) {
            o->flags |= OF_LEAK_REPORTED;
            ot_report(lc, NULL, CS_KIND_LIVE_AT_EXIT, o, NULL, 0, 0);
            n++;
        } else if (what == 1) {
            not_renamed(lc, st, o, NULL, NULL);
            n++;
        } else if (what == 0) {
            o->flags |= OF_LEAK_REPORTED;
            if (o->ns == CS_NS_NUMPY) {
                ot_report(lc, NULL, CS_KIND_NUMPY_LEAK, o, NULL, 0, 0);
            } else {
                report_tensor_leak(lc, o,
                                   (o->flags & OF_DROPPED)        ? CS_LEAK_SHUTDOWN
                                   : o->state == CS_ST_CONSUMED ? CS_LEAK_CONSUMED
                                                                : CS_LEAK_NEVER_CONSUMED,
                                   &ind);
            }
            n++;
        }
        ot_unlock(lc, st);
    }
    free(v);
    return n;
}

/* ---- a process killed without a leak verdict ---- */

static int cmp_slot(const void *a, const void *b)
{
    const cs_live_slot *x = a, *y = b;
    if (x->time_ns != y->time_ns)
        return (x->time_ns > y->time_ns) - (x->time_ns < y->time_ns);
    return (x->obj > y->obj) - (x->obj < y->obj);
}

int cs_lc_finish_killed(cs_lifecycle *lc, const cs_live_slot *slots, size_t n)
{
    cs_live_slot *v = n ? malloc(n * sizeof *v) : NULL;
    if (!v)
        return 0;
    memcpy(v, slots, n * sizeof *v);
    qsort(v, n, sizeof *v, cmp_slot); /* in the order they were made */
    int nrep = 0;
    for (size_t i = 0; i < n; i++) {
        const cs_live_slot *s = &v[i];
        int ns = s->kind == CS_EV_NP_ALLOC ? CS_NS_NUMPY : CS_NS_DLPACK;
        if (!s->obj || (s->flags & CS_EVF_NULL_DELETER) ||
            (ns == CS_NS_NUMPY && (s->flags & CS_EVF_IMPORT)) || s->time_ns < lc->born_ns)
            continue; /* nobody can release it, module data, or the parent's */
        int kind = ns == CS_NS_NUMPY ? CS_KIND_LIVE_AT_EXIT : CS_KIND_DLPACK_LEAK;
        uint32_t detail = ns == CS_NS_NUMPY ? CS_LIVE_KILLED : CS_LEAK_KILLED;
        stripe *st = ot_stripe_of(lc, s->obj);
        ot_lock(lc, st);
        obj *o = ot_find(st, s->obj, ns);
        if (o && o->nhist) {
            /* its history is in the trace (it has findings): judged by it */
            if (o->state != CS_ST_RELEASED && !(o->flags & OF_LEAK_REPORTED)) {
                o->flags |= OF_LEAK_REPORTED;
                ot_report(lc, NULL, kind, o, NULL, detail, 0);
                nrep++;
            }
        } else {
            /* known only from its slot: its making (and consume) events */
            cs_event h[2] = {{.kind = s->kind, .aux = s->aux, .flags = s->flags,
                              .thread = s->thread, .time_ns = s->time_ns, .obj = s->obj,
                              .stack = s->stack}};
            if (ns == CS_NS_NUMPY)
                h[0].a = s->bytes;
            else
                h[0].c = s->bytes;
            uint8_t nh = 1;
            if (s->consume_stack)
                h[nh++] = (cs_event){.kind = CS_EV_CONSUME, .obj = s->obj, .thread = s->thread,
                                     .time_ns = s->time_ns, .stack = s->consume_stack};
            obj tmp = {.key = s->obj, .ns = (uint8_t)ns, .bytes = s->bytes, .hist = h, .nhist = nh};
            ot_report(lc, NULL, kind, &tmp, NULL, detail, 0);
            nrep++;
        }
        ot_unlock(lc, st);
    }
    free(v);
    return nrep;
}

/* ---- a scope's end (API mode) ---- */

static uint64_t consumed_at(const obj *o)
{
    if (o->flags & OF_XAPI)
        return o->nhist ? o->hist[0].time_ns : 0; /* owned from its birth */
    for (unsigned i = 0; i < o->nhist; i++)
        if (o->hist[i].kind == CS_EV_CONSUME)
            return o->hist[i].time_ns;
    return 0;
}

typedef struct since_list {
    uint64_t since_ns;
    uint64_t *v;
    size_t n, cap;
} since_list;

static void consumed_since(cs_lifecycle *lc, obj *o, void *ud)
{
    (void)lc;
    since_list *l = ud;
    if (o->state == CS_ST_CONSUMED && !(o->flags & (OF_NULL_DELETER | OF_VIEW)) &&
        consumed_at(o) >= l->since_ns && ot_room_for_one(&l->v, l->n, &l->cap, sizeof *l->v))
        l->v[l->n++] = o->key;
}

size_t cs_lc_consumed_since(cs_lifecycle *lc, uint64_t since_ns, uint64_t **out)
{
    since_list l = {since_ns, NULL, 0, 0};
    ot_each_live(lc, CS_NS_DLPACK, consumed_since, &l);
    if (l.n)
        qsort(l.v, l.n, sizeof *l.v, cmp_u64_key);
    *out = l.v;
    return l.n;
}

int cs_lc_report_dlpack_leak(cs_lifecycle *lc, uint64_t key)
{
    stripe *st = ot_stripe_of(lc, key);
    ot_lock(lc, st);
    obj *o = ot_find(st, key, CS_NS_DLPACK);
    int live = o && o->state == CS_ST_CONSUMED && !(o->flags & OF_LEAK_REPORTED);
    uint64_t data = live ? o->data : 0;
    ot_unlock(lc, st);
    if (!live)
        return 0;
    /* its buffer: the live NumPy blocks its data lies in */
    leak_ref *v = NULL;
    size_t nv = 0, cap = 0;
    if (ot_room_for_one(&v, nv, &cap, sizeof *v))
        v[nv++] = (leak_ref){0, key, data, 0, CS_NS_DLPACK, 0, -1};
    for (int i = 0; data && v && i < NSTRIPES; i++) {
        stripe *s2 = &lc->s[i];
        ot_lock(lc, s2);
        for (size_t k = 0; k < s2->cap; k++) {
            obj *b = &s2->tab[k];
            if (b->key && b->ns == CS_NS_NUMPY && b->state == CS_ST_CREATED &&
                !(b->flags & OF_LEAK_REPORTED) && b->key <= data &&
                data < b->key + (b->bytes ? b->bytes : 1) &&
                ot_room_for_one(&v, nv, &cap, sizeof *v))
                v[nv++] = (leak_ref){0, b->key, b->key, b->key + b->bytes, CS_NS_NUMPY, 0, 0};
        }
        ot_unlock(lc, s2);
    }
    cs_finding ind;
    if (v)
        gather_indirect(lc, v, nv, 0, &ind);
    else
        memset(&ind, 0, sizeof ind);
    free(v);
    ot_lock(lc, st);
    o = ot_find(st, key, CS_NS_DLPACK);
    int n = 0;
    if (o && o->state == CS_ST_CONSUMED && !(o->flags & OF_LEAK_REPORTED)) {
        o->flags |= OF_LEAK_REPORTED;
        report_tensor_leak(lc, o, CS_LEAK_CONSUMED, &ind);
        n = 1;
    }
    ot_unlock(lc, st);
    return n;
}
