/* DLPack 1.3's exchange API's rules (rulebook-seams R50-R56): tensors that
 * cross through a type's DLPackExchangeAPI table, with no capsule. Their
 * births and hand-overs are judged here; from then on they live by the
 * DLPack rules (proto_dlpack.c: deleter, data, leaks), since they are the
 * same structs with the same deleter. */
#include "protocol.h"

/* A birth through the table. from_py and the allocator hand the caller an
 * owning tensor, and a view is the caller's while its call lasts:
 * consumed from birth, data watched (R51, R53, R54). A struct the caller
 * gave to_py is consumed by to_py's library when it was taken (HANDED),
 * else its caller still owns it (R52). No capsule follows. */
static unsigned on_birth(cs_lifecycle *lc, stripe *st, obj *o, const cs_event *ev, judge *j)
{
    (void)lc;
    if (o && o->state != CS_ST_RELEASED)
        ot_count(st, o, -1); /* a live struct born again: the old one went unseen */
    if (!o && !(o = ot_insert(st, ev->obj, CS_NS_DLPACK)))
        return 0;
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
        return 0; /* to_py failed: its caller's, to delete */
    o->state = CS_ST_CONSUMED;
    o->data = ev->a;
    if (o->data && cs_lc_data_watch)
        cs_lc_data_watch(o->key, o->data, o->bytes, 1);
    if (o->slot && cs_lc_live_consumed)
        cs_lc_live_consumed(o->slot, ev->stack);
    return 0;
}

/* A live tensor handed to to_py, which took it: its owner is now to_py's
 * library (R52). A released one handed over is used after its release. */
static unsigned on_handover(cs_lifecycle *lc, stripe *st, obj *o, const cs_event *ev, judge *j)
{
    if (!o)
        return 0; /* made before capsan started */
    if (o->state == CS_ST_RELEASED) {
        ot_report(lc, j, CS_KIND_DLPACK_RECONSUME, o, ev, o->state, 0);
        ot_hist_add(st, o, ev, j);
        return 0;
    }
    o->state = CS_ST_CONSUMED;
    ot_hist_add(st, o, ev, j);
    return 0;
}

/* A broken calling contract (R51, R52, R54-R56) or a bad table (R50). The
 * finding's value: the entry in the low byte, the evidence above it. */
static unsigned on_check(cs_lifecycle *lc, stripe *st, obj *o, const cs_event *ev, judge *j)
{
    int table = ev->aux >= CS_XC_TABLE_FIRST;
    uint64_t value = (ev->b << 8) | (ev->extra & 0xff);
    int kind = table ? CS_KIND_DLPACK_BAD_EXCHANGE_TABLE : CS_KIND_DLPACK_EXCHANGE_CONTRACT;
    if (!table && o && o->nhist && ev->aux == CS_XC_TO_PY_RELEASED) {
        /* about the tensor to_py released: its history says so */
        ot_report(lc, j, kind, o, ev, ev->aux, value);
        ot_hist_add(st, o, ev, j);
        return 0;
    }
    obj tmp = {.key = ev->obj};
    ot_report(lc, j, kind, &tmp, ev, ev->aux, value);
    return 0;
}

/* R53: a view's call returned; its memory is the producer's again,
 * unless its caller kept the DLTensor (in static or heap memory): then a
 * free of that memory is a stale view kept past its call */
static unsigned on_view_end(cs_lifecycle *lc, stripe *st, obj *o, const cs_event *ev, judge *j)
{
    (void)lc;
    if (!o || !(o->flags & OF_VIEW) || o->state != CS_ST_CONSUMED)
        return 0;
    ot_hist_add(st, o, ev, j);
    if (ev->aux == CS_DELETE_VIEW_KEPT)
        o->flags |= OF_VIEW_KEPT;
    else
        ot_entomb(st, o);
    return 0;
}

const cs_protocol cs_proto_xapi = {
    .name = "DLPack exchange API",
    .ns = CS_NS_DLPACK,
    .rules = {
        [CS_EV_EXPORT] = on_birth,     /* with a CS_DLV_X aux bit */
        [CS_EV_XHANDOVER] = on_handover,
        [CS_EV_XCHECK] = on_check,
        [CS_EV_DELETE] = on_view_end,  /* aux CS_DELETE_VIEW_END */
    },
};
