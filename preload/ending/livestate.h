/* Crash-safe live state: every live DLPack tensor and NumPy block has a
 * slot in the trace's LIVE records (cs_live_slot), written in place when
 * it is made, consumed and released. The trace is a shared file mapping,
 * so a process killed by SIGKILL still leaves what it held. The cost is one
 * slot store per transition, bounded by live objects, not events. */
#ifndef CAPSAN_LIVESTATE_H
#define CAPSAN_LIVESTATE_H

#include <stdatomic.h>
#include <stdint.h>
#include "tracefmt.h"

/* Slots are handed out from NPOOLS pools; the caller serialises the calls
 * of one pool (the lifecycle passes its stripe, under the stripe's lock). */
#define CS_LIVE_POOLS 64

/* Set while a released object's events are replayed into the lifecycle
 * (young.c, young_dl.c): a dead object needs no slot, and taking one may
 * allocate between a program's free and its double free, which would
 * then free capsan's memory instead of failing. */
extern __thread int cs_live_replaying __attribute__((tls_model("initial-exec")));
/* A slot for an object made by `origin` (its first event): an id, 0 when
 * there is no trace to write to (or cs_live_replaying). */
uint32_t cs_live_put(unsigned pool, const cs_event *origin, uint64_t bytes);
/* The object of slot id was consumed at `stack`. */
void cs_live_consumed(uint32_t id, uint32_t stack);
/* The object is gone: its slot is free again. */
void cs_live_drop(uint32_t id);
/* Fill slot s for an object made by `origin`: the key last, so a slot the
 * reader sees filled is whole (a SIGKILL can come between any two stores). */
static inline void cs_live_fill(cs_live_slot *s, const cs_event *origin, uint64_t bytes)
{
    s->bytes = bytes;
    s->time_ns = origin->time_ns;
    s->stack = origin->stack;
    s->consume_stack = 0;
    s->thread = origin->thread;
    s->kind = origin->kind;
    s->flags = origin->flags;
    s->aux = origin->aux;
    atomic_store_explicit((_Atomic uint64_t *)&s->obj, origin->obj, memory_order_release);
}
/* n slots of a LIVE record of the caller's own (young.c), zeroed, or
 * NULL when there is no trace: written in place as cs_live_put writes
 * its slots, the key last. Valid while cs_trace_gen() is unchanged. */
cs_live_slot *cs_live_block(uint32_t n);
/* In a forked child the parent's slots are in the parent's file: ids of
 * another trace generation are void (ignored), and the lifecycle mirrors
 * its live objects again into the child's file (cs_lc_remirror). */

#endif
