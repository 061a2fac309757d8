/* NEP 49 data blocks' rules (rulebook R27-R33): a block is born by its
 * handler's malloc and released by exactly one free, through the handler
 * that allocated it, while that handler still stands as it was. */
#include "protocol.h"

/* R32: numpy 1.24 tracks failed allocations as NULL */
static unsigned on_alloc(cs_lifecycle *lc, stripe *st, obj *o, const cs_event *ev, judge *j)
{
    (void)lc;
    if (!ev->obj)
        return 0;
    if (o && o->state == CS_ST_CREATED)
        ot_count(st, o, -1); /* a missed free: the old block is gone */
    if (!o && !(o = ot_insert(st, ev->obj, CS_NS_NUMPY)))
        return 0;
    ot_reset(st, o);
    o->bytes = ev->a;
    ot_count(st, o, 1);
    ot_hist_add(st, o, ev, j);
    return 0;
}

/* R28, R29: freed through a handler that is stale, not the one that
 * allocated it, or re-pointed in place since, or freed twice. free(NULL, n) from sort is legal; an
 * unknown block may predate capsan (import capsan starts late). */
static unsigned on_free(cs_lifecycle *lc, stripe *st, obj *o, const cs_event *ev, judge *j)
{
    if (!ev->obj || !o)
        return 0;
    if (o->state == CS_ST_CREATED) {
        const cs_event *born = o->nhist && o->hist[0].kind == CS_EV_NP_ALLOC ? &o->hist[0] : NULL;
        uint32_t stale = cs_np_free_stale(born, ev);
        ot_hist_add(st, o, ev, j);
        if (stale)
            ot_report(lc, j, CS_KIND_NUMPY_STALE_HANDLER, o, NULL, stale, ev->c);
        ot_entomb(st, o);
    } else if (o->state == CS_ST_RELEASED && ev->c) {
        /* a legacy PyDataMem_FREE (c == 0) may free a block that came back
         * out of numpy's small-block cache unseen: not judged */
        ot_report(lc, j, CS_KIND_NUMPY_DOUBLE_FREE, o, ev, 0, 0);
        ot_hist_add(st, o, ev, j);
    }
    return 0;
}

static unsigned on_wrap(cs_lifecycle *lc, stripe *st, obj *o, const cs_event *ev, judge *j)
{
    (void)lc, (void)o, (void)j;
    st->wrap = *ev; /* told with the free that follows */
    return 0;
}

/* R30: numpy free()d an OWNDATA array's data that no handler gave it, or
 * an OWNDATA alias of a block its handler freed already; with where an
 * extension made an array around that memory, if known */
static unsigned on_foreign_free(cs_lifecycle *lc, stripe *st, obj *o, const cs_event *ev, judge *j)
{
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
        /* the array that owned it died first: numpy frees it again */
        ot_report(lc, j, CS_KIND_NUMPY_DOUBLE_FREE, o, ev, 0, 0);
        ot_hist_add(st, o, ev, j);
    } else {
        obj tmp = {.key = ev->obj, .hist = &wrap, .nhist = (uint8_t)wrapped};
        ot_report(lc, j, CS_KIND_NUMPY_FOREIGN_FREE, &tmp, ev, 0, 0);
    }
    return 0;
}

static unsigned on_reachable(cs_lifecycle *lc, stripe *st, obj *o, const cs_event *ev, judge *j)
{
    (void)lc;
    if (o && o->state == CS_ST_CREATED) {
        o->flags |= OF_REACHABLE;
        ot_hist_add(st, o, ev, j);
    }
    return 0;
}

/* R27: an invalid handler installed */
static unsigned on_handler(cs_lifecycle *lc, stripe *st, obj *o, const cs_event *ev, judge *j)
{
    (void)st, (void)o;
    if (ev->extra) {
        obj tmp = {.key = ev->obj};
        ot_report(lc, j, CS_KIND_NUMPY_BAD_HANDLER, &tmp, ev, ev->extra, ev->b);
    }
    return 0;
}

const cs_protocol cs_proto_numpy = {
    .name = "NEP 49 data blocks",
    .ns = CS_NS_NUMPY,
    .rules = {
        [CS_EV_NP_ALLOC] = on_alloc,
        [CS_EV_NP_FREE] = on_free,
        [CS_EV_NP_HANDLER] = on_handler,
        [CS_EV_NP_FOREIGN_FREE] = on_foreign_free,
        [CS_EV_NP_REACHABLE] = on_reachable,
        [CS_EV_NP_WRAP] = on_wrap,
    },
};
