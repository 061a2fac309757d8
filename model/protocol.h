/* One ownership machine, several protocols (internal to model/).
 *
 * Every protocol is a loan of memory across a library boundary: a birth,
 * hand-overs, and exactly one release. lifecycle.c runs the machine: it
 * finds the object an event is about, hands the event to the rule its
 * protocol has for that event kind, and keeps what the rule recorded.
 * Each protocol's rules are a table of its own, one function per event
 * kind, in a file of its own:
 *   proto_dlpack.c  DLPack capsules (rulebook R3-R21)
 *   proto_xapi.c    DLPack 1.3's exchange API (R50-R56); its tensors then
 *                   live by the DLPack rules (deleter, data, leaks)
 *   proto_numpy.c   NEP 49 data blocks (R27-R33)
 *   proto_arrow.c   Arrow C Data / C Stream structs in capsules (R40-R48)
 * The verdicts at a process's end are verdicts.c's. */
#ifndef CAPSAN_PROTOCOL_H
#define CAPSAN_PROTOCOL_H

#include "objtable.h"

/* A rule: judge ev about o (NULL: not known) in stripe st; returns
 * CS_VERDICT_* bits. */
typedef unsigned (*cs_rule)(cs_lifecycle *lc, stripe *st, obj *o, const cs_event *ev, judge *j);

#define CS_EV_KINDS 33
typedef struct cs_protocol {
    const char *name;
    int ns;                        /* the object namespace it keeps (CS_NS_*) */
    cs_rule rules[CS_EV_KINDS];    /* by event kind; NULL: nothing to judge */
} cs_protocol;

extern const cs_protocol cs_proto_dlpack, cs_proto_xapi, cs_proto_numpy, cs_proto_arrow;

/* The protocol an event belongs to. */
static inline const cs_protocol *cs_protocol_of(const cs_event *ev)
{
    /* the kinds that name their protocol alone: NumPy's 16..23, Arrow's
     * 25..31 (one load and one test, as the NumPy range check was) */
    static const cs_protocol *const own[256] = {
        [CS_EV_NP_ALLOC ... 23] = &cs_proto_numpy,
        [CS_EV_AR_EXPORT ... 31] = &cs_proto_arrow,
    };
    const cs_protocol *p = own[ev->kind];
    if (p)
        return p;
    if (ev->kind == CS_EV_XHANDOVER || ev->kind == CS_EV_XCHECK ||
        (ev->kind == CS_EV_EXPORT && (ev->aux & CS_DLV_X)) ||
        (ev->kind == CS_EV_DELETE && (ev->aux == CS_DELETE_VIEW_END || ev->aux == CS_DELETE_VIEW_KEPT)))
        return &cs_proto_xapi;
    return &cs_proto_dlpack;
}

/* DLPack: a consumer released the tensor and left its capsule unconsumed,
 * and the capsule was used after that (or the process ends with it):
 * dlpack-not-renamed, once, with ev (may be NULL) as the evidence. */
void cs_dl_not_renamed(cs_lifecycle *lc, stripe *st, obj *o, const cs_event *ev, judge *j);

/* A live object whose address (Arrow: whose record) the scan at the end
 * found stored somewhere: held, not leaked (proto_dlpack.c; Arrow's too). */
unsigned cs_rule_reachable(cs_lifecycle *lc, stripe *st, obj *o, const cs_event *ev, judge *j);

#endif
