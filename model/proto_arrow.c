/* The Arrow PyCapsule interface's rules (rulebook-seams R40-R49): a
 * schema, array or stream struct lent in an arrow_* capsule is born at
 * PyCapsule_New, read by consumers (a borrow), moved out (the capsule dies
 * with release == NULL and no release ran) and released exactly once by
 * its release callback, which must set release = NULL. A stream's
 * get_next / get_schema results are born owned by their caller, and so is
 * a struct handed over by address (R49: filled by arrow::Export*, or met
 * first at an import), which an import by address moves into the importer.
 *
 * The object is capsan's record of the struct (preload/arrow/arrow_rec.c), not its
 * address: every bitwise copy carries the record, so a move keeps it.
 * States: CREATED (its capsule owns it), CONSUMED (moved out, or a
 * stream callback's result), RELEASED. */
#include "protocol.h"

#include <stdlib.h>

/* Per-object flags of this namespace (its own bits, beside the generic
 * OF_LEAK_REPORTED / OF_TRACED / OF_CAPSULE_DEAD) */
#define AF_READ (1u << 24)       /* a consumer read it while it was set */
#define AF_MISUSE (1u << 25)     /* arrow-stream-misuse already reported */
#define AF_UNFOLLOWED (1u << 26) /* arrow_wrap=0: releases are not seen */
#define AF_EMPTY (1u << 27)      /* arrow-bad-struct (released when first read) already
                                  * reported: one struct, one finding, however often read */

/* Released: a tombstone. Arrow structs are not counted in the tensor and
 * block totals (ot_count), so none is taken off them; their births are
 * counted apart (on_export). */
static void retire(stripe *st, obj *o)
{
    o->state = CS_ST_RELEASED;
    ot_entomb(st, o);
}

static unsigned on_export(cs_lifecycle *lc, stripe *st, obj *o, const cs_event *ev, judge *j)
{
    (void)lc;
    if (!o && !(o = ot_insert(st, ev->obj, CS_NS_ARROW)))
        return 0;
    ot_reset(st, o); /* a record is reused only once its struct is released */
    ot_born(st, CS_NS_ARROW); /* the clean-run line's count */
    o->capsule = ev->a;
    if (!ev->a)
        o->state = CS_ST_CONSUMED; /* a stream callback's result is its caller's */
    if (ev->aux & CS_AR_UNFOLLOWED)
        o->flags |= AF_UNFOLLOWED;
    ot_hist_add(st, o, ev, j);
    return 0;
}

/* R43: a consumer reading a struct that is released already: consumed
 * twice when someone read or moved it before, else handed out empty */
static unsigned on_borrow(cs_lifecycle *lc, stripe *st, obj *o, const cs_event *ev, judge *j)
{
    if (!o)
        return 0; /* exported before capsan started */
    if (ev->aux & CS_ARB_IMPORT) {
        /* R49: moved into an importer, which releases it from now on */
        o->state = CS_ST_CONSUMED;
        ot_hist_add(st, o, ev, j);
        return 0;
    }
    if (!(ev->aux & CS_ARB_RELEASED)) {
        o->flags |= AF_READ;
        ot_hist_add(st, o, ev, j);
        return 0;
    }
    if ((o->flags & AF_READ) || o->state != CS_ST_CREATED)
        ot_report(lc, j, CS_KIND_ARROW_RECONSUME, o, ev, 0, 0);
    else if (!(o->flags & AF_EMPTY)) {
        o->flags |= AF_EMPTY;
        /* a library reading back a placeholder it made itself (nanoarrow's
         * CSchema.allocate()) handed nothing over: not a bad struct */
        if (!(ev->aux & CS_ARB_OWN))
            ot_report(lc, j, CS_KIND_ARROW_BAD_STRUCT, o, ev, CS_ARK_RELEASED, 0);
    }
    ot_hist_add(st, o, ev, j);
    return 0;
}

/* R42, R44, arrow_deep=1: a child's or dictionary's release that went
 * wrong, about the struct it belongs to (o, which may be released by now:
 * a child moved out is released after its parent) */
static unsigned on_child_release(cs_lifecycle *lc, stripe *st, obj *o, const cs_event *ev,
                                 judge *j)
{
    obj tmp = {.key = ev->obj, .ns = CS_NS_ARROW};
    obj *about = o ? o : &tmp;
    unsigned v = 0;
    if (ev->aux & CS_ARR_AGAIN) {
        ot_report(lc, j, CS_KIND_ARROW_DOUBLE_RELEASE, about, ev, CS_ARR_CHILD, 0);
        v = CS_VERDICT_SKIP;
    } else {
        if (ev->aux & CS_ARR_NOT_CLEARED)
            ot_report(lc, j, CS_KIND_ARROW_RELEASE_NOT_CLEARED, about, ev, CS_ARR_CHILD, 0);
        if (ev->aux & CS_ARR_KIDS_LEFT)
            ot_report(lc, j, CS_KIND_ARROW_LEAK, about, ev, CS_LEAK_CHILD, ev->extra);
    }
    if (o && o->state != CS_ST_RELEASED)
        ot_hist_add(st, o, ev, j);
    return v;
}

/* R42, R44: one release, which clears itself. The runtime says AGAIN
 * before a second one runs (its record is the authority: a released
 * object's tombstone may be forgotten here). */
static unsigned on_release(cs_lifecycle *lc, stripe *st, obj *o, const cs_event *ev, judge *j)
{
    if (ev->aux & CS_ARR_CHILD)
        return on_child_release(lc, st, o, ev, j);
    if ((ev->aux & CS_ARR_AGAIN) || (o && o->state == CS_ST_RELEASED)) {
        obj tmp = {.key = ev->obj, .ns = CS_NS_ARROW};
        ot_report(lc, j, CS_KIND_ARROW_DOUBLE_RELEASE, o ? o : &tmp, ev, 0, 0);
        if (o)
            ot_hist_add(st, o, ev, j);
        return CS_VERDICT_SKIP;
    }
    if (!o)
        return 0;
    ot_hist_add(st, o, ev, j);
    if (ev->aux & CS_ARR_NOT_CLEARED)
        ot_report(lc, j, CS_KIND_ARROW_RELEASE_NOT_CLEARED, o, NULL, 0, 0);
    if (ev->aux & CS_ARR_KIDS_LEFT) /* R44: a child it left alone leaks */
        ot_report(lc, j, CS_KIND_ARROW_LEAK, o, NULL, CS_LEAK_CHILD, ev->extra);
    retire(st, o);
    return 0;
}

/* R45: no callback on a released stream; calls serialized. A first batch
 * tells where the stream's data lies (b): memory it keeps alive is part of
 * its leak (verdicts.c) */
static unsigned on_call(cs_lifecycle *lc, stripe *st, obj *o, const cs_event *ev, judge *j)
{
    obj tmp = {.key = ev->obj, .ns = CS_NS_ARROW};
    if (o && ev->b && !(ev->aux & (CS_ARC_RELEASED | CS_ARC_CONCURRENT))) {
        if (!o->data)
            o->data = ev->b;
        ot_hist_add(st, o, ev, j); /* a replay of the trace links the same way */
        return 0;
    }
    if (ev->aux & CS_ARC_RELEASED) {
        ot_report(lc, j, CS_KIND_ARROW_USE_AFTER_RELEASE, o ? o : &tmp, ev, ev->aux & 0xff,
                  !!(ev->aux & CS_ARC_SAME));
    } else if ((ev->aux & CS_ARC_CONCURRENT) && !(o && (o->flags & AF_MISUSE))) {
        if (o)
            o->flags |= AF_MISUSE;
        ot_report(lc, j, CS_KIND_ARROW_STREAM_MISUSE, o ? o : &tmp, ev, ev->aux & 0xff, ev->extra);
    }
    if (o)
        ot_hist_add(st, o, ev, j);
    return 0;
}

/* R41: the capsule died. Set: its destructor must have released it (the
 * release came first); NULL with no release: a consumer moved it out. */
static unsigned on_destroy(cs_lifecycle *lc, stripe *st, obj *o, const cs_event *ev, judge *j)
{
    if (!o || o->capsule != ev->a)
        return 0;
    o->flags |= OF_CAPSULE_DEAD;
    if (o->state == CS_ST_RELEASED)
        return 0;
    switch (ev->aux) {
    case CS_ARD_SET:
        ot_hist_add(st, o, ev, j);
        o->flags |= OF_LEAK_REPORTED;
        ot_report(lc, j, CS_KIND_ARROW_LEAK, o, NULL,
                  (ev->extra & CS_ARDX_NO_DTOR) ? CS_LEAK_NULL_DESTRUCTOR : CS_LEAK_DESTROYED, 0);
        retire(st, o);
        break;
    case CS_ARD_MOVED:
        o->state = CS_ST_CONSUMED;
        ot_hist_add(st, o, ev, j);
        break;
    default: /* not followed: nothing to judge */
        retire(st, o);
    }
    return 0;
}

/* R40, R43, R45, R48 */
static unsigned on_check(cs_lifecycle *lc, stripe *st, obj *o, const cs_event *ev, judge *j)
{
    obj tmp = {.key = ev->obj, .ns = CS_NS_ARROW};
    if (ev->aux == CS_ARK_BAD_NAME) {
        /* a capsule, not a record: nothing follows it (the runtime says it
         * once per name and call site) */
        ot_report(lc, j, CS_KIND_ARROW_BAD_NAME, &tmp, ev, ev->extra, 0);
        return 0;
    }
    int kind = ev->aux == CS_ARK_RENAMED ? CS_KIND_ARROW_RENAMED : CS_KIND_ARROW_BAD_STRUCT;
    ot_report(lc, j, kind, o ? o : &tmp, ev, ev->aux, ev->b);
    if (o)
        ot_hist_add(st, o, ev, j);
    return 0;
}

const cs_protocol cs_proto_arrow = {
    .name = "Arrow PyCapsule interface",
    .ns = CS_NS_ARROW,
    .rules = {
        [CS_EV_AR_EXPORT] = on_export,
        [CS_EV_AR_BORROW] = on_borrow,
        [CS_EV_AR_RELEASE] = on_release,
        [CS_EV_AR_CALL] = on_call,
        [CS_EV_AR_DESTROY] = on_destroy,
        [CS_EV_AR_CHECK] = on_check,
        [CS_EV_AR_REACHABLE] = cs_rule_reachable, /* held, not leaked */
    },
};

/* ---- a scope's end (API mode) ---- */

static int moved_since(const obj *o, uint64_t since_ns)
{
    return o->nhist && o->hist[0].time_ns >= since_ns;
}

size_t cs_lc_arrow_moved_since(cs_lifecycle *lc, uint64_t since_ns, uint64_t **out)
{
    return ot_owned_since(lc, CS_NS_ARROW, moved_since, since_ns, out);
}

int cs_lc_report_arrow_leak(cs_lifecycle *lc, uint64_t key)
{
    stripe *st = ot_stripe_of(lc, key);
    ot_lock(lc, st);
    obj *o = ot_find(st, key, CS_NS_ARROW);
    int n = o && o->state == CS_ST_CONSUMED && !(o->flags & OF_LEAK_REPORTED);
    if (n) {
        o->flags |= OF_LEAK_REPORTED;
        ot_report(lc, NULL, CS_KIND_ARROW_LEAK, o, NULL, CS_LEAK_CONSUMED, 0);
    }
    ot_unlock(lc, st);
    return n;
}
