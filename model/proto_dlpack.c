/* The DLPack capsule protocol's rules (rulebook R3-R21), one per event
 * kind: a tensor is born EXPORTed in a "dltensor" capsule, CONSUMEd when
 * a consumer renames the capsule used_*, and RELEASED by exactly one call
 * of its deleter, the consumer's, or the producer's destructor's while the
 * capsule is still unconsumed. Tensors born through the exchange API
 * (proto_xapi.c) live by these rules after their birth. */
#include "protocol.h"

void cs_dl_not_renamed(cs_lifecycle *lc, stripe *st, obj *o, const cs_event *ev, judge *j)
{
    o->flags &= (uint32_t)~OF_UNRENAMED;
    o->flags |= OF_NOT_RENAMED;
    if (ev)
        ot_hist_add(st, o, ev, j);
    ot_report(lc, j, CS_KIND_DLPACK_NOT_RENAMED, o, NULL, 0, 0);
}

static int live(const obj *o)
{
    return o && (o->state == CS_ST_CREATED || o->state == CS_ST_CONSUMED);
}

/* A capsule is made around a tensor. A NULL deleter is legal (R10): only
 * a consumer that calls it errs. */
static unsigned on_export(cs_lifecycle *lc, stripe *st, obj *o, const cs_event *ev, judge *j)
{
    (void)lc;
    if (live(o) && (o->flags & OF_NULL_DELETER) && (ev->flags & CS_EVF_NULL_DELETER)) {
        /* a static struct without a deleter, lent again: each export is a
         * new loan (nobody ever releases it) */
        ot_count(st, o, -1);
    } else if (live(o) && o->state == CS_ST_CONSUMED && (o->flags & OF_XAPI) &&
               !(o->flags & OF_VIEW)) {
        /* an owning exchange-API tensor (from_py, the allocator) lent on in
         * a capsule by its owner: a new loan, judged by R3-R8 from now on
         * (consumed by whoever takes the capsule, else deleted by its
         * destructor). Its data is watched again once it is consumed. */
        if (o->data && cs_lc_data_watch)
            cs_lc_data_watch(o->key, o->data, o->bytes, -1);
        o->data = 0;
        o->state = CS_ST_CREATED;
        o->capsule = ev->a;
        o->flags &= (uint32_t)~(OF_CAPSULE_DEAD | OF_CAPSULE_USED | OF_XAPI);
        ot_hist_add(st, o, ev, j);
        return 0;
    } else if (live(o)) {
        /* the same live struct in a second capsule: judge the newest */
        ot_hist_add(st, o, ev, j);
        o->capsule = ev->a;
        o->flags &= (uint32_t)~(OF_CAPSULE_DEAD | OF_CAPSULE_USED);
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
    ot_hist_add(st, o, ev, j);
    return 0;
}

/* R13-R21: a malformed field; R20: the loaned metadata changed (a change
 * made before the consume is seen again at the delete: said once) */
static unsigned on_bad_tensor(cs_lifecycle *lc, stripe *st, obj *o, const cs_event *ev, judge *j)
{
    (void)st;
    if (!o) {
        obj tmp = {.key = ev->obj};
        ot_report(lc, j, CS_KIND_DLPACK_BAD_TENSOR, &tmp, ev, ev->extra, ev->b);
        return 0;
    }
    if (ev->extra == CS_BAD_MUTATED) {
        if (o->flags & OF_MUTATED)
            return 0;
        o->flags |= OF_MUTATED;
    }
    ot_report(lc, j, CS_KIND_DLPACK_BAD_TENSOR, o, ev, ev->extra, ev->b);
    return 0;
}

/* numpy's own numpy_dltensor capsule around an imported tensor */
static unsigned on_own(cs_lifecycle *lc, stripe *st, obj *o, const cs_event *ev, judge *j)
{
    (void)lc;
    if (o && o->state != CS_ST_RELEASED)
        ot_hist_add(st, o, ev, j);
    return 0;
}

/* R7: the consumer renames the capsule used_* and owns the tensor;
 * consuming it again, or after its release, is dlpack-reconsume. R17:
 * torch before 2.13 ignores byte_offset, and so does a consumer whose own
 * array starts at data (detail 2). */
static unsigned on_consume(cs_lifecycle *lc, stripe *st, obj *o, const cs_event *ev, judge *j)
{
    if (!o)
        return 0; /* exported before capsan started */
    if (o->state == CS_ST_RELEASED && (o->flags & OF_UNRENAMED) && ev->a == o->capsule) {
        /* released, then renamed: the consumer took ownership and let go
         * before it renamed (JAX does, when it copies the data). The name
         * now keeps the producer's destructor away: no harm done */
        o->flags &= (uint32_t)~OF_UNRENAMED;
        o->flags |= OF_CAPSULE_USED;
        ot_hist_add(st, o, ev, j);
        return CS_VERDICT_LATE_RENAME;
    }
    if (o->state != CS_ST_CREATED) {
        ot_report(lc, j, CS_KIND_DLPACK_RECONSUME, o, ev, o->state, 0);
        ot_hist_add(st, o, ev, j);
        return 0;
    }
    o->state = CS_ST_CONSUMED;
    if (ev->aux & CS_CONSUME_WRONG_NAME)
        o->flags |= OF_WRONG_NAME; /* its producer will not see it consumed */
    if (!(ev->flags & CS_EVF_OFFSET_IGNORED))
        o->data = ev->c;
    if (o->data && cs_lc_data_watch)
        cs_lc_data_watch(o->key, o->data, o->bytes, 1);
    if (ev->a == o->capsule)
        o->flags |= OF_CAPSULE_USED;
    if (o->slot && cs_lc_live_consumed)
        cs_lc_live_consumed(o->slot, ev->stack);
    ot_hist_add(st, o, ev, j);
    if (ev->flags & CS_EVF_OFFSET_IGNORED)
        ot_report(lc, j, CS_KIND_DLPACK_BYTE_OFFSET_IGNORED, o, NULL,
                  (ev->aux & CS_CONSUME_VIEW_SEEN) ? 2 : 0, ev->c);
    return 0;
}

/* R8, R25: a consumer's read of a consumed or released tensor (the
 * runtime records no other; the destructor's own reads are not events).
 * Read by its consumed name while still consumed, it is its owner using
 * what it owns (a consumer that keeps the capsule and releases the tensor
 * at cleanup): not a second consumption. */
static unsigned on_getptr(cs_lifecycle *lc, stripe *st, obj *o, const cs_event *ev, judge *j)
{
    if (!o || !(o->state == CS_ST_CONSUMED || o->state == CS_ST_RELEASED) ||
        (ev->flags & CS_EVF_IN_DTOR))
        return 0;
    if (ev->kind == CS_EV_GETPTR_USED && o->state == CS_ST_CONSUMED)
        return 0;
    if (o->state == CS_ST_RELEASED && (o->flags & OF_NOT_RENAMED))
        return 0; /* the unrenamed capsule: already explained */
    if (o->state == CS_ST_RELEASED && (o->flags & OF_UNRENAMED)) {
        /* read through the capsule its consumer released but left
         * unconsumed: the missing rename explains it */
        cs_dl_not_renamed(lc, st, o, ev, j);
        return 0;
    }
    ot_report(lc, j, CS_KIND_DLPACK_RECONSUME, o, ev, o->state, 0);
    ot_hist_add(st, o, ev, j);
    return 0;
}

/* ---- the deleter: R3, R8, R10, by the state the tensor is in ---- */

/* Released before anyone consumed it. By its capsule's destructor that is
 * the normal end of an unconsumed export; by anyone else the capsule
 * still says "dltensor" (R8) and what comes next judges it: a rename now
 * is a late one (JAX renames just after a copy released the tensor); the
 * destructor deleting again, a read through the capsule, or its death
 * with the unconsumed name is dlpack-not-renamed. */
static unsigned delete_created(stripe *st, obj *o, const cs_event *ev, judge *j, int in_own_dtor)
{
    ot_hist_add(st, o, ev, j);
    ot_entomb(st, o);
    if (in_own_dtor || (o->flags & OF_CAPSULE_DEAD))
        return 0;
    o = ot_find(st, ev->obj, CS_NS_DLPACK); /* entomb may move it */
    if (o)
        o->flags |= OF_UNRENAMED;
    return CS_VERDICT_UNRENAMED;
}

/* Released by its owner: the normal end, unless the producer's
 * destructor does it to a consumed capsule (R3). Unprotected, that call
 * runs and releases the tensor, and the consumer's own delete later is
 * the double delete this finding already explains. */
static unsigned delete_consumed(cs_lifecycle *lc, stripe *st, obj *o, const cs_event *ev, judge *j,
                                int in_own_dtor)
{
    if (!in_own_dtor || (o->flags & OF_WRONG_NAME)) {
        /* (a destructor that found its capsule under the other version's
         * consumed name rightly took it for unconsumed: the consumer's
         * rename is the fault, said at the rename) */
        ot_hist_add(st, o, ev, j);
        ot_entomb(st, o);
        return 0;
    }
    if (!(o->flags & OF_UNCHECKED)) {
        o->flags |= OF_UNCHECKED;
        ot_report(lc, j, CS_KIND_DLPACK_UNCHECKED_DESTRUCTOR, o, ev, 0, 0);
    }
    ot_hist_add(st, o, ev, j);
    if (!lc->protect)
        ot_entomb(st, o);
    return CS_VERDICT_SKIP;
}

/* A second release: reported before it runs, naming the earlier finding
 * that made the first release the wrong one, if any. protect=1 skips it. */
static unsigned delete_released(cs_lifecycle *lc, stripe *st, obj *o, const cs_event *ev, judge *j,
                                int in_own_dtor)
{
    if ((o->flags & OF_UNRENAMED) && in_own_dtor) {
        /* the double delete the missing rename leads to */
        cs_dl_not_renamed(lc, st, o, ev, j);
        return CS_VERDICT_SKIP;
    }
    int cause = 0;
    if ((o->flags & OF_NOT_RENAMED) && in_own_dtor)
        cause = CS_KIND_DLPACK_NOT_RENAMED; /* predicted, once something else said it */
    else if ((o->flags & OF_UNCHECKED) && !in_own_dtor)
        cause = CS_KIND_DLPACK_UNCHECKED_DESTRUCTOR; /* the consumer's, after the producer's */
    else if ((o->flags & OF_WRONG_NAME) && !in_own_dtor)
        cause = CS_KIND_DLPACK_BAD_TENSOR; /* after the destructor the wrong name misled */
    else if (in_own_dtor && (o->flags & OF_CAPSULE_USED)) {
        if (!(o->flags & OF_UNCHECKED)) {
            o->flags |= OF_UNCHECKED;
            ot_report(lc, j, CS_KIND_DLPACK_UNCHECKED_DESTRUCTOR, o, ev, 0, 0);
        }
        ot_hist_add(st, o, ev, j);
        return CS_VERDICT_SKIP;
    }
    ot_report(lc, j, CS_KIND_DLPACK_DOUBLE_DELETE, o, ev, (uint32_t)cause, 0);
    ot_hist_add(st, o, ev, j);
    return CS_VERDICT_SKIP;
}

static unsigned on_delete(cs_lifecycle *lc, stripe *st, obj *o, const cs_event *ev, judge *j)
{
    if (!o)
        return 0;
    if ((ev->flags & CS_EVF_NO_PYTHON) && ev->c)
        ot_keep_at_shutdown(lc, ev->c);
    if (ev->aux == CS_DELETE_NULL_CALL) {
        /* R10: a consumer jumped through the NULL deleter: the crash that
         * follows is this tensor's */
        ot_hist_add(st, o, ev, j);
        ot_report(lc, j, CS_KIND_DLPACK_NULL_DELETER, o, NULL, 0, 0);
        return 0;
    }
    /* its capsule's destructor, not another capsule's made where that one
     * lay once it died (freed objects' memory is reused: numpy's internal
     * capsule, releasing what a torch tensor held, at a dead export's
     * address) */
    int in_own_dtor = (ev->flags & CS_EVF_IN_DTOR) && ev->a == o->capsule &&
                      !(o->flags & OF_CAPSULE_DEAD);
    switch (o->state) {
    case CS_ST_CREATED: return delete_created(st, o, ev, j, in_own_dtor);
    case CS_ST_CONSUMED: return delete_consumed(lc, st, o, ev, j, in_own_dtor);
    case CS_ST_RELEASED: return delete_released(lc, st, o, ev, j, in_own_dtor);
    }
    return 0;
}

/* R12, R33: a Python call without the GIL (obj is the call site, already
 * deduplicated by the runtime) */
static unsigned on_no_gil(cs_lifecycle *lc, stripe *st, obj *o, const cs_event *ev, judge *j)
{
    (void)st, (void)o;
    obj tmp = {.key = ev->obj};
    int kind = ev->aux == CS_NOGIL_IN_DELETER ? CS_KIND_DLPACK_DELETER_NO_GIL
             : ev->aux == CS_NOGIL_HANDLER    ? CS_KIND_NUMPY_HANDLER_NO_GIL
                                              : CS_KIND_CAPSULE_NO_GIL;
    ot_report(lc, j, kind, &tmp, ev, ev->aux, ev->a);
    return 0;
}

/* R6: the producer freed what the consumer still reads (once a tensor);
 * an exchange-API view's memory freed while its call lasts (R53) */
static unsigned on_data_freed(cs_lifecycle *lc, stripe *st, obj *o, const cs_event *ev, judge *j)
{
    if (!o || o->state != CS_ST_CONSUMED || (o->flags & OF_DATA_FREED))
        return 0;
    o->flags |= OF_DATA_FREED;
    ot_report(lc, j, (o->flags & OF_VIEW) ? CS_KIND_DLPACK_STALE_VIEW : CS_KIND_DLPACK_DATA_FREED,
              o, ev, ev->aux | ((o->flags & OF_VIEW_KEPT) ? CS_FREED_KEPT : 0), ev->a);
    ot_hist_add(st, o, ev, j);
    return 0;
}

/* at _exit, its address is stored somewhere: kept in the history, since a
 * replay of a live-at-exit finding must know why it was not a leak */
unsigned cs_rule_reachable(cs_lifecycle *lc, stripe *st, obj *o, const cs_event *ev, judge *j)
{
    (void)lc;
    if (o && o->state != CS_ST_RELEASED) {
        o->flags |= OF_REACHABLE;
        ot_hist_add(st, o, ev, j);
    }
    return 0;
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

/* Released during interpreter shutdown by a deleter that freed nothing. A
 * tensor its consumer held and let go of then stays clean (numpy keeps
 * such an array alive on purpose, PR 22510); one nobody ever consumed was
 * only dropped: leaked, judged at exit. */
static unsigned on_dropped(cs_lifecycle *lc, stripe *st, obj *o, const cs_event *ev, judge *j)
{
    (void)lc;
    if (o && o->state == CS_ST_RELEASED && !ever_consumed(o) &&
        !(o->flags & (OF_LEAK_REPORTED | OF_NULL_DELETER | OF_DROPPED))) {
        ot_hist_add(st, o, ev, j);
        o->flags |= OF_DROPPED;
        o->data = ev->c;
        o->gen = ++st->gen; /* out of the tombstone FIFO until the exit verdict */
    }
    return 0;
}

/* memory of a handler for another device exported as plain CPU */
static unsigned on_device(cs_lifecycle *lc, stripe *st, obj *o, const cs_event *ev, judge *j)
{
    if (o) {
        ot_hist_add(st, o, ev, j);
        ot_report(lc, j, CS_KIND_DLPACK_DEVICE_MISMATCH, o, NULL, ev->aux, ev->b);
    }
    return 0;
}

/* R3: the exporting capsule died. Unconsumed, nobody can release its
 * tensor any more: unless its destructor did, that is a leak. */
static unsigned on_destroy(cs_lifecycle *lc, stripe *st, obj *o, const cs_event *ev, judge *j)
{
    if (ev->extra & CS_DESTROY_REENTERED) {
        /* R4: its destructor brought it back to life and it is dying again
         * inside that destructor */
        if (!o) {
            obj tmp = {.key = ev->obj};
            ot_report(lc, j, CS_KIND_DLPACK_DESTRUCTOR_REENTERED, &tmp, ev, 0, 0);
        } else if (!(o->flags & OF_REENTERED)) {
            o->flags |= OF_REENTERED;
            ot_report(lc, j, CS_KIND_DLPACK_DESTRUCTOR_REENTERED, o, ev, 0, 0);
            ot_hist_add(st, o, ev, j);
        }
        return 0;
    }
    if (!o || ev->a != o->capsule)
        return 0;
    o->flags |= OF_CAPSULE_DEAD;
    if (o->state == CS_ST_RELEASED && (o->flags & OF_UNRENAMED)) {
        /* died with the unconsumed name after its tensor was released:
         * whatever its destructor did, the consumer never renamed it */
        cs_dl_not_renamed(lc, st, o, ev, j);
        return 0;
    }
    if (o->state == CS_ST_CREATED && (ev->extra & CS_DESTROY_TOOK)) {
        /* the destructor took the tensor by its unconsumed name and
         * released it without the deleter field (JAX's calls its deleter
         * function directly): released, not leaked */
        ot_hist_add(st, o, ev, j);
        ot_entomb(st, o);
        return 0;
    }
    if (o->state == CS_ST_CREATED && !(o->flags & (OF_LEAK_REPORTED | OF_NULL_DELETER))) {
        ot_hist_add(st, o, ev, j);
        o->flags |= OF_LEAK_REPORTED;
        ot_report(lc, j, CS_KIND_DLPACK_LEAK, o, NULL,
                  (ev->extra & CS_DESTROY_NO_DTOR) ? CS_LEAK_NULL_DESTRUCTOR : CS_LEAK_DESTROYED, 0);
    }
    return 0;
}

/* R5: a destructor or deleter must leave the caller's error indicator as
 * it found it: one that clears it (PyErr_Clear after a failed
 * PyCapsule_GetPointer) makes its caller raise SystemError or lose the
 * error; one that leaves a new one set surfaces it at an unrelated line */
static unsigned on_err_state(cs_lifecycle *lc, stripe *st, obj *o, const cs_event *ev, judge *j)
{
    if (!o) {
        obj tmp = {.key = ev->obj};
        ot_report(lc, j, CS_KIND_DLPACK_ERROR_CLOBBERED, &tmp, ev, ev->aux, ev->a);
        return 0;
    }
    if (o->flags & OF_CLOBBERED)
        return 0;
    o->flags |= OF_CLOBBERED;
    ot_report(lc, j, CS_KIND_DLPACK_ERROR_CLOBBERED, o, ev, ev->aux, ev->a);
    ot_hist_add(st, o, ev, j);
    return 0;
}

/* R17: its consumer ignored byte_offset and handed the memory on from the
 * data field (reexport.c): said once per tensor, at the re-export */
static unsigned on_reexport(cs_lifecycle *lc, stripe *st, obj *o, const cs_event *ev, judge *j)
{
    if (!o || o->state != CS_ST_CONSUMED || (o->flags & OF_OFFSET_DROPPED))
        return 0;
    o->flags |= OF_OFFSET_DROPPED;
    ot_report(lc, j, CS_KIND_DLPACK_BYTE_OFFSET_IGNORED, o, ev, 1, ev->c);
    ot_hist_add(st, o, ev, j);
    return 0;
}

const cs_protocol cs_proto_dlpack = {
    .name = "DLPack capsules",
    .ns = CS_NS_DLPACK,
    .rules = {
        [CS_EV_EXPORT] = on_export,
        [CS_EV_OWN] = on_own,
        [CS_EV_CONSUME] = on_consume,
        [CS_EV_GETPTR_USED] = on_getptr,
        [CS_EV_GETPTR] = on_getptr,
        [CS_EV_DELETE] = on_delete,
        [CS_EV_DESTROY] = on_destroy,
        [CS_EV_BAD_TENSOR] = on_bad_tensor,
        [CS_EV_NO_GIL] = on_no_gil,
        [CS_EV_DEVICE] = on_device,
        [CS_EV_DATA_FREED] = on_data_freed,
        [CS_EV_DROPPED] = on_dropped,
        [CS_EV_REACHABLE] = cs_rule_reachable,
        [CS_EV_ERR_STATE] = on_err_state,
        [CS_EV_REEXPORT] = on_reexport,
    },
};
