/* The one place where events become findings: one ownership machine,
 * each protocol's rules a table of their own (protocol.h).
 *
 * Linked into the runtime (live checks: protect, halt, exit status) and
 * into the report tool (offline replay of a trace). Both feed the same
 * events in the same per-object order, so both see the same findings.
 * Per-object state is kept in NSTRIPES independent tables keyed by
 * (namespace, object address); the runtime locks one stripe around an
 * event (cs_lc_lock), the reader passes threadsafe = 0. */
#ifndef CAPSAN_LIFECYCLE_H
#define CAPSAN_LIFECYCLE_H

#include <stddef.h>
#include <stdatomic.h>
#include <stdint.h>
#include "tracefmt.h"

enum cs_severity { CS_SEV_WARNING = 1, CS_SEV_ERROR = 2 };

enum cs_kind {
    CS_KIND_NONE = 0,
#define KIND(e, name, sev, help) CS_KIND_##e,
#include "kinds.inc"
#undef KIND
    CS_KIND_COUNT
};

const char *cs_kind_name(int kind);       /* "dlpack-double-delete" */
int cs_kind_severity(int kind);           /* CS_SEV_* */
const char *cs_kind_help(int kind);
struct cs_finding;
/* A finding's severity: its kind's, except a leak judged without a leak
 * verdict (the process was killed), which is a warning. */
int cs_finding_severity(const struct cs_finding *f);
int cs_kind_from_name(const char *name);  /* CS_KIND_NONE if unknown */

#define CS_FINDING_MAX_EVENTS 8
#define CS_FINDING_MAX_INDIRECT 4

/* An object kept alive only by a leaked one (LeakSanitizer's indirect
 * leak): a NumPy block whose data a leaked tensor still lends out. */
typedef struct cs_indirect {
    uint16_t kind;        /* the kind it would have had on its own */
    uint64_t obj, bytes;
    cs_event alloc;       /* where it was made */
} cs_indirect;

typedef struct cs_finding {
    uint16_t kind;        /* cs_kind */
    uint16_t nevents;
    uint32_t detail;      /* CS_BAD_* for bad-tensor / bad-handler, else 0 */
    uint64_t obj;         /* struct or data pointer */
    uint64_t bytes;       /* leaked or affected bytes, 0 if unknown */
    uint64_t value;       /* the offending value for bad-tensor */
    cs_event events[CS_FINDING_MAX_EVENTS]; /* the object's history, in order */
    /* leaks: what only this leak keeps alive (counted in indirect_bytes,
     * never as findings of their own); the first ones in indirect[] */
    uint32_t nindirect;
    uint64_t indirect_bytes;
    cs_indirect indirect[CS_FINDING_MAX_INDIRECT];
} cs_finding;

/* A short message for a finding, e.g. "deleter of DLManagedTensor 0x... ran
 * twice". Returns buf. */
const char *cs_finding_message(const cs_finding *f, char *buf, size_t n);
/* "DLManagedTensor", "DLManagedTensorVersioned", "numpy data", ... */
const char *cs_finding_object_type(const cs_finding *f);
/* "export", "consume", "delete", "destroy", "alloc", "free", ... */
const char *cs_event_name(const cs_event *ev);
/* A phrase for text reports: "exported at", "deleted again at", ... */
const char *cs_event_phrase(const cs_finding *f, int index);
/* The kind of memory a REACHABLE event's word lies in (CS_WHERE_*), in
 * words, and as JSON names it ("data", "heap", "stack", "anonymous");
 * NULL when not recorded. */
const char *cs_where_text(unsigned region);
const char *cs_where_name(unsigned region);

typedef void (*cs_finding_cb)(void *ud, const cs_finding *f);

typedef struct cs_lifecycle cs_lifecycle;

cs_lifecycle *cs_lc_create(cs_finding_cb cb, void *ud, int threadsafe);
void cs_lc_destroy(cs_lifecycle *lc);
/* protect=1: calls judged CS_VERDICT_SKIP are not executed, so they do not
 * change the object's state. The reader takes it from the trace's OPTIONS. */
void cs_lc_set_protect(cs_lifecycle *lc, int on);

/* Serialise events about one object (runtime only; no-ops when not
 * threadsafe). Take it before writing the event to the trace so that the
 * file order of one object's events is the order they were judged in. */
void cs_lc_lock(cs_lifecycle *lc, uint64_t obj);
void cs_lc_unlock(cs_lifecycle *lc, uint64_t obj);

/* Write-behind: events stay in their object's in-memory history until the
 * object has a finding; then its unwritten history, and from then on each
 * of its events, go to the sink (the trace) before the finding callback
 * runs. Without a sink (the reader, or record_all=1 where the runtime
 * writes every event itself) nothing is forwarded. */
typedef void (*cs_event_sink)(void *ud, const cs_event *ev);
void cs_lc_set_sink(cs_lifecycle *lc, cs_event_sink sink, void *ud);
/* A forked child writes a new trace: its objects' histories count as
 * unwritten again. */
void cs_lc_fork_child(cs_lifecycle *lc);
/* Objects made before time_ns (a forked child's inheritance, made by its
 * parent) are the parent's to judge: not leaks or live-at-exit of this
 * process at _exit. The runtime sets it at fork, the reader at the
 * trace's start. */
void cs_lc_set_born(cs_lifecycle *lc, uint64_t time_ns);

/* Verdict bits returned by cs_lc_event */
#define CS_VERDICT_SKIP 1u  /* a repeated delete: protect=1 may skip the call */
#define CS_VERDICT_UNRENAMED 2u /* a delete left its tensor released under a capsule
                                 * that still has the unconsumed name */
#define CS_VERDICT_LATE_RENAME 4u /* a consume renamed a capsule whose tensor its consumer
                                   * had already released (judged harmless) */

/* Judge one event; findings go to the callback before it returns. */
unsigned cs_lc_event(cs_lifecycle *lc, const cs_event *ev);
/* The same, and when found != NULL also what cs_lc_origin would have said
 * just before: the object's creating event in *origin, and *found = 1 if
 * the object is known and live, 2 if known and already released, 0 if
 * unknown. One table lookup for both. */
unsigned cs_lc_judge(cs_lifecycle *lc, const cs_event *ev, cs_event *origin, int *found);

/* The process ended. With how == CS_END_EXIT every object still alive is
 * a leak candidate and is reported. With CS_END_QUICK_EXIT (_exit: no
 * finalization) a live object is a leak only if the runtime's scan found
 * its address nowhere (no REACHABLE event); the reachable ones are
 * live-at-exit warnings. Otherwise (signal, killed) nothing is judged a
 * leak. Returns the number of findings it reported. */
int cs_lc_finish(cs_lifecycle *lc, int how);

/* Call fn on every block of memory the lifecycle owns (its tables and
 * histories hold every object's address): a reachability scan skips them. */
void cs_lc_own_memory(cs_lifecycle *lc, void (*fn)(void *ud, const void *p, size_t n), void *ud);

/* The process ended without a leak verdict (killed: no END record, or a
 * fatal signal). `slots` are its crash-safe live state (CS_REC_LIVE):
 * every DLPack tensor still there is a dlpack-leak warning ("not released
 * when the process was killed"), every NumPy block a live-at-exit warning.
 * Returns how many were reported. */
int cs_lc_finish_killed(cs_lifecycle *lc, const cs_live_slot *slots, size_t n);

/* Events judged so far (a forked child counts its own). */
uint64_t cs_lc_events(cs_lifecycle *lc);

/* Live objects right now (tests, reports). */
size_t cs_lc_live(cs_lifecycle *lc);

/* Judge the live objects of a namespace whose origin event has c ==
 * origin_c (NumPy: the handler struct that allocated them) and came at or
 * after since_ns as leaks now, except the nheld keys of held (sorted;
 * NULL when none): an API scope's blocks that a Python object still
 * refers to. Returns how many were reported. */
int cs_lc_report_live(cs_lifecycle *lc, int ns, uint64_t origin_c, uint64_t since_ns,
                      const uint64_t *held, size_t nheld);

/* The keys of the live objects of a namespace that a normal exit would
 * judge leaked if they stayed alive (not held, not module data), sorted,
 * into a cs_malloc'd *out the caller cs_frees; returns how many. */
size_t cs_lc_exit_candidates(cs_lifecycle *lc, int ns, uint64_t **out);
/* Whether the live NumPy block key holds the data of a tensor whose deleter
 * declined at shutdown (CS_EV_DROPPED): that, not a Python object, is what
 * keeps it. */
int cs_lc_block_kept_at_shutdown(cs_lifecycle *lc, uint64_t key);
/* The same for _exit (CS_END_QUICK_EXIT): what this process made (not what
 * it inherited when it forked) and is still alive. */
size_t cs_lc_quick_exit_candidates(cs_lifecycle *lc, int ns, uint64_t **out);
/* [lo[i], hi[i]) = the memory keys[i] stands for: a live NumPy block's
 * bytes (who[i] = 0), or the data of a DLPack tensor a consumer holds,
 * who[i] = the consumer's return address, or CS_LC_WHO_XFROM for one an
 * exchange-API caller took ([0, 0): neither) */
#define CS_LC_WHO_XFROM 1u
void cs_lc_spans(cs_lifecycle *lc, const uint64_t *keys, size_t n, uint64_t *lo, uint64_t *hi,
                 uint64_t *who);

/* The keys of the live objects of a namespace whose origin event has c ==
 * origin_c and came at or after since_ns, sorted, into a cs_malloc'd *out
 * the caller cs_frees; returns how many (the ones cs_lc_report_live would
 * judge). */
size_t cs_lc_live_from(cs_lifecycle *lc, int ns, uint64_t origin_c, uint64_t since_ns,
                       uint64_t **out);
/* The live, unreported objects of every namespace whose latest event came
 * at or after since_ns (or whose history is unknown): what an API scope
 * that began then may still have to judge. A walk of the table, no
 * allocation. */
size_t cs_lc_touched_since(cs_lifecycle *lc, uint64_t since_ns);
/* Their keys in namespace ns, sorted, into a cs_malloc'd *out the caller
 * cs_frees; returns how many. */
size_t cs_lc_touched_keys(cs_lifecycle *lc, int ns, uint64_t since_ns, uint64_t **out);

/* API mode's scope end: the consumed, unreleased, unreported tensors whose
 * consume came at or after since_ns, sorted, into a cs_malloc'd *out the
 * caller cs_frees; returns how many. */
size_t cs_lc_consumed_since(cs_lifecycle *lc, uint64_t since_ns, uint64_t **out);
/* Report the consumed tensor `key` as a dlpack-leak now, with the live
 * NumPy blocks its data lies in as its indirect part. 1 if reported. */
int cs_lc_report_dlpack_leak(cs_lifecycle *lc, uint64_t key);

/* The same for Arrow structs: moved out (or a stream's results) since
 * since_ns and not released, sorted into *out; and one reported as an
 * arrow-leak now (proto_arrow.c). */
size_t cs_lc_arrow_moved_since(cs_lifecycle *lc, uint64_t since_ns, uint64_t **out);
int cs_lc_report_arrow_leak(cs_lifecycle *lc, uint64_t key);

/* The live, unreported objects of a namespace (what cs_lc_finish would
 * judge), sorted by address into a cs_malloc'd *out the caller cs_frees.
 * Returns how many; 0 with *out == NULL when there are none. */
size_t cs_lc_live_keys(cs_lifecycle *lc, int ns, uint64_t **out);
/* Those whose latest event ran on one of the n threads (capsan's thread
 * numbers), with that thread: what a thread still running at exit may
 * hold. In no order, cs_malloc'd as above. */
typedef struct cs_lc_held {
    uint64_t key;
    uint32_t thread;
} cs_lc_held;
size_t cs_lc_live_held_by(cs_lifecycle *lc, int ns, const uint32_t *threads, size_t n,
                          cs_lc_held **out);

/* The runtime's watch on consumed tensors' data (dataguard.c): called with
 * sign +1 when tensor `key` whose data span is known is consumed, -1 when
 * it stops being consumed (released, or lent again), under its stripe's
 * lock. NULL (the report tool): nothing is called. */
extern void (*cs_lc_data_watch)(uint64_t key, uint64_t data, uint64_t bytes, int sign);
/* The runtime's crash-safe mirror of live objects (livestate.c): a slot
 * when an object is made (its first event), news of its consume, the end
 * of it. Called under the object's stripe lock, with that stripe's index
 * as the pool. NULL (the report tool): nothing is mirrored. */
extern uint32_t (*cs_lc_live_put)(unsigned pool, const cs_event *origin, uint64_t bytes);
extern void (*cs_lc_live_consumed)(uint32_t slot, uint32_t stack);
extern void (*cs_lc_live_drop)(uint32_t slot);
/* Mirror every live object again (a forked child's new trace file). */
void cs_lc_remirror(cs_lifecycle *lc);
/* R28 for the free `fr` of the block `born` made (an NP_ALLOC): 0 when it
 * goes through the handler, ctx and functions that made the block, else
 * why not (CS_STALE_*). The NEP 49 rule's own test, for a runtime that
 * retires clean pairs itself (inline: every NumPy free on its thread asks). */
static inline uint32_t cs_np_free_stale(const cs_event *born, const cs_event *fr)
{
    if (fr->extra) /* the handler is gone, changed or its ctx freed */
        return fr->extra;
    if (born && born->c && fr->c && born->c != fr->c)
        return CS_STALE_OTHER;
    /* the same handler, re-pointed in place: another pool frees it */
    if (born && born->extra && fr->a && born->extra != (uint32_t)fr->a)
        return CS_STALE_REPOINTED;
    return 0;
}

/* Running totals of live objects, kept as events are judged (cheap). */
typedef struct cs_lc_totals {
    int64_t dlpack, dlpack_bytes, numpy, numpy_bytes;
    int64_t born_dlpack, born_numpy; /* every tensor and block made so far */
    int64_t born_arrow;              /* every Arrow struct exported (stream chunks included) */
} cs_lc_totals;
void cs_lc_totals_get(cs_lifecycle *lc, cs_lc_totals *out);
/* The same and the events judged so far (cs_lc_events), in one pass. */
void cs_lc_tally(cs_lifecycle *lc, cs_lc_totals *out, uint64_t *events);
/* Objects the runtime judges outside the table (young.c, young_dl.c:
 * NumPy blocks and DLPack tensors still on the thread that made them), added to cs_lc_totals_get and
 * cs_lc_events: their live and born counts and the events judged there.
 * NULL (the report tool): none. */
extern void (*cs_lc_outside)(cs_lc_totals *add, uint64_t *events);
/* The table's live NumPy blocks counted by a hash of their address, if
 * the runtime gives the counters (young.c: a block at an address the
 * table may hold alive is judged there, as a missed free). NULL: none. */
#define CS_LC_NP_LIVE_BITS 16
extern _Atomic uint16_t *cs_lc_np_live;
static inline unsigned cs_lc_np_live_at(uint64_t key)
{
    return (unsigned)(((key >> 4) * 0xc2b2ae3d27d4eb4full) >> (64 - CS_LC_NP_LIVE_BITS));
}
/* The same for the table's live DLPack tensors (young_dl.c: an export at
 * an address the table may hold alive is judged there, a second export
 * of a live struct), by the same hash. */
extern _Atomic uint16_t *cs_lc_dl_live;

/* Object namespaces: a DLPack struct and a NumPy block may share an address
 * over time, so they are judged apart. */
enum cs_ns { CS_NS_DLPACK = 0, CS_NS_NUMPY = 1, CS_NS_ARROW = 2 /* capsan's records */ };
enum cs_obj_state { CS_ST_UNKNOWN = 0, CS_ST_CREATED, CS_ST_CONSUMED, CS_ST_RELEASED };
/* State of one object (call with its stripe locked in the runtime). */
int cs_lc_state(cs_lifecycle *lc, int ns, uint64_t obj);

/* The event that created the object (EXPORT / NP_ALLOC), also for a
 * tombstone; 1 if known. Runtime: call with the stripe locked. */
int cs_lc_origin(cs_lifecycle *lc, int ns, uint64_t obj, cs_event *out);

/* fork(): lock every stripe before, unlock after (parent and child). */
void cs_lc_lock_all(cs_lifecycle *lc);
void cs_lc_unlock_all(cs_lifecycle *lc);

/* cs_finding.detail for leaks */
enum cs_leak_detail {
    CS_LEAK_CONSUMED = 1,   /* consumed, deleter never called */
    CS_LEAK_DESTROYED = 2,  /* capsule destroyed unconsumed, deleter not called */
    CS_LEAK_NEVER_CONSUMED = 3, /* capsule alive and unconsumed at exit */
    CS_LEAK_NULL_DESTRUCTOR = 4, /* capsule created without a destructor */
    CS_LEAK_SHUTDOWN = 5,   /* never consumed; its deleter ran during interpreter
                             * shutdown and released nothing */
    CS_LEAK_KILLED = 6,     /* not released when the process was killed: a warning */
    CS_LEAK_CHILD = 7,      /* Arrow, arrow_deep=1: a child or dictionary its parent's
                             * release left alone (value: its index, 0xffffffff the
                             * dictionary) */
};
/* cs_finding.detail for live-at-exit */
enum cs_live_detail { CS_LIVE_QUICK_EXIT = 0, CS_LIVE_KILLED = 1 };

#endif
