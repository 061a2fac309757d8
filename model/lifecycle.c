/* The one ownership machine: events become findings. An event goes to
 * its protocol's rule for its kind (protocol.h: capsules, the exchange
 * API, NEP 49 blocks, each a table in a file of its own); what the rule
 * records is kept per object by objtable.c, and the verdicts at a
 * process's end are verdicts.c's.
 *
 * Released objects stay as tombstones so that a repeated delete or free is
 * recognised; each stripe keeps at most TOMB_PER_STRIPE of them, a bound
 * shared by the runtime and the reader so both judge alike. */
#include "lifecycle.h"
#include "protocol.h"

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
    const cs_protocol *p = cs_protocol_of(ev);
    int ns = p->ns;
    obj *o = ot_find(st, ev->obj, ns);
    if (found) {
        /* what the object was made by, as it stood before this event */
        *found = !(o && o->nhist) ? 0 : o->state == CS_ST_RELEASED ? 2 : 1;
        if (*found)
            *origin = o->hist[0];
    }
    cs_rule rule = ev->kind < CS_EV_KINDS ? p->rules[ev->kind] : NULL;
    unsigned v = rule ? rule(lc, st, o, ev, &j) : 0;
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

