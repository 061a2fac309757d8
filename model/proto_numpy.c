/* NEP 49 data blocks' rules (rulebook R27-R33): a block is born by its
 * handler's malloc and released by exactly one free, through the handler
 * that allocated it, while that handler still stands as it was. */
#include "protocol.h"

/* A block at one address can hold another: a handler that carves its
 * pieces out of an array's data (an arena, a pool) hands out that data's
 * first byte as a block of its own while the array lives. Such a block,
 * made by another handler, is kept beside the old one in the same entry:
 * `data` is its handler (0: none), `capsule` its allocator value, and its
 * alloc is in the history. Its bytes lie inside the old block's and are not
 * counted again until the old block is freed and it stands alone. */
static const cs_event *born_of(const obj *o)
{
    return o->nhist && o->hist[0].kind == CS_EV_NP_ALLOC ? &o->hist[0] : NULL;
}

static int nests(const obj *o, const cs_event *ev)
{
    const cs_event *born = born_of(o);
    return born && born->c && ev->c && born->c != ev->c;
}

/* the old block at o was freed while the block inside it lives on: o is
 * that block from now on, born by its own alloc */
static void unnest(stripe *st, obj *o, judge *j)
{
    cs_event born = {.kind = CS_EV_NP_ALLOC, .obj = o->key, .c = o->data,
                     .extra = (uint32_t)o->capsule};
    for (unsigned i = o->nhist; i-- > 1;)
        if (o->hist[i].kind == CS_EV_NP_ALLOC && o->hist[i].c == o->data) {
            born = o->hist[i];
            break;
        }
    ot_count(st, o, -1);
    ot_reset(st, o);
    o->bytes = born.a;
    ot_count(st, o, 1);
    ot_hist_add(st, o, &born, j);
}

/* R32: numpy 1.24 tracks failed allocations as NULL */
static unsigned on_alloc(cs_lifecycle *lc, stripe *st, obj *o, const cs_event *ev, judge *j)
{
    (void)lc;
    if (!ev->obj)
        return 0;
    if (o && o->state == CS_ST_CREATED && nests(o, ev)) {
        /* a piece of the live block (or the piece's own handler giving
         * its address again after a free capsan missed) */
        o->data = ev->c;
        o->capsule = ev->extra;
        ot_hist_add(st, o, ev, j);
        return 0;
    }
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
    if (o->state == CS_ST_CREATED && o->data && ev->c == o->data) {
        /* the block inside the old one, freed through its own handler */
        cs_event inner = {.kind = CS_EV_NP_ALLOC, .c = o->data, .extra = (uint32_t)o->capsule};
        uint32_t stale = cs_np_free_stale(&inner, ev);
        ot_hist_add(st, o, ev, j);
        if (stale && !(o->flags & OF_STALE_TOLD))
            ot_report(lc, j, CS_KIND_NUMPY_STALE_HANDLER, o, NULL, stale, ev->c);
        o->data = o->capsule = 0;
    } else if (o->state == CS_ST_CREATED) {
        uint32_t stale = cs_np_free_stale(born_of(o), ev);
        ot_hist_add(st, o, ev, j);
        /* told as its handler died: the free through it is that finding's */
        if (stale && !(o->flags & OF_STALE_TOLD))
            ot_report(lc, j, CS_KIND_NUMPY_STALE_HANDLER, o, NULL, stale, ev->c);
        if (o->data)
            unnest(st, o, j); /* the block inside lives on at this address */
        else
            ot_entomb(st, o);
    } else if (o->state == CS_ST_RELEASED && ev->c) {
        /* a legacy PyDataMem_FREE (c == 0) may free a block that came back
         * out of numpy's small-block cache unseen: not judged */
        ot_report(lc, j, CS_KIND_NUMPY_DOUBLE_FREE, o, ev, 0, 0);
        ot_hist_add(st, o, ev, j);
    }
    return 0;
}

/* R28: the handler that made o died (its struct or ctx freed) while o
 * lives: o is stale now, whatever a free through it later does (the
 * first such free may crash the program before it is judged) */
static unsigned on_orphan(cs_lifecycle *lc, stripe *st, obj *o, const cs_event *ev, judge *j)
{
    if (!o || o->state != CS_ST_CREATED || (o->flags & OF_STALE_TOLD))
        return 0;
    const cs_event *born = born_of(o);
    if (!(born && born->c == ev->c) && !(o->data && o->data == ev->c))
        return 0; /* another handler's block at that address */
    ot_hist_add(st, o, ev, j);
    o->flags |= OF_STALE_TOLD;
    ot_report(lc, j, CS_KIND_NUMPY_STALE_HANDLER, o, NULL, ev->extra | CS_STALE_AT_DEATH, ev->c);
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
        o->flags |= OF_REACHABLE | (ev->aux == CS_WHERE_PY_REACHED ? OF_PY_HELD : 0);
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
        [CS_EV_NP_ORPHAN] = on_orphan,
    },
};
