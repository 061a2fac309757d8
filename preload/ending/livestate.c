/* Crash-safe live state (livestate.h). Each pool grows by LIVE records of
 * SLOTS_PER_REC slots reserved in the trace; freed slots are reused
 * through a free list threaded through the `bytes` field of free slots,
 * which the reader ignores (obj == 0). */
#include "livestate.h"

#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "tracefile.h"
#include "alloc.h"

#define SLOTS_PER_REC 128
#define MAX_RECS 4096 /* per pool: 512 Ki live objects each; then no slot */

/* A pool is its stripe's (objtable.c: pool_of), used under that stripe's
 * lock. Its list of records grows by doubling: most pools hold one or
 * two records, and 64 fixed lists of MAX_RECS would be 2 MiB zeroed */
typedef struct pool {
    cs_live_slot **recs;
    uint32_t nrecs, caprecs;
    uint32_t free_head; /* slot index + 1, 0 = none */
    uint32_t gen;       /* trace generation the records are in */
} pool;

static pool *pools[CS_LIVE_POOLS];

/* id: pool (6 bits), then the index within the pool + 1 (26 bits) */
static inline uint32_t make_id(unsigned p, uint32_t idx) { return (uint32_t)p << 26 | (idx + 1); }

static cs_live_slot *slot_of(uint32_t id)
{
    pool *pl = id ? pools[id >> 26] : NULL;
    uint32_t idx = (id & ((1u << 26) - 1)) - 1;
    if (!pl || pl->gen != cs_trace_gen() || idx / SLOTS_PER_REC >= pl->nrecs)
        return NULL; /* a parent's slot, in a forked child */
    return &pl->recs[idx / SLOTS_PER_REC][idx % SLOTS_PER_REC];
}

static int grow(pool *pl)
{
    if (pl->nrecs == MAX_RECS)
        return -1;
    if (pl->nrecs == pl->caprecs) {
        uint32_t cap = pl->caprecs ? pl->caprecs * 2 : 4;
        cs_live_slot **r = cs_realloc(pl->recs, cap * sizeof *r);
        if (!r)
            return -1;
        pl->recs = r;
        pl->caprecs = cap;
    }
    cs_rec *hdr;
    cs_rec_live *r = cs_trace_begin(CS_REC_LIVE, sizeof *r + SLOTS_PER_REC * sizeof(cs_live_slot),
                                    &hdr);
    if (!r)
        return -1;
    r->nslots = SLOTS_PER_REC;
    r->reserved = 0;
    cs_live_slot *s = (cs_live_slot *)(r + 1);
    memset(s, 0, SLOTS_PER_REC * sizeof *s);
    cs_trace_commit(hdr, CS_REC_LIVE);
    uint32_t base = pl->nrecs * SLOTS_PER_REC;
    pl->recs[pl->nrecs++] = s;
    for (uint32_t i = SLOTS_PER_REC; i-- > 0;) { /* lowest index first out */
        s[i].bytes = pl->free_head;
        pl->free_head = base + i + 1;
    }
    return 0;
}

cs_live_slot *cs_live_block(uint32_t n)
{
    if (!cs_trace_started())
        return NULL;
    cs_rec *hdr;
    cs_rec_live *r = cs_trace_begin(CS_REC_LIVE, sizeof *r + n * sizeof(cs_live_slot), &hdr);
    if (!r)
        return NULL;
    r->nslots = n;
    r->reserved = 0;
    cs_live_slot *s = (cs_live_slot *)(r + 1);
    memset(s, 0, n * sizeof *s);
    cs_trace_commit(hdr, CS_REC_LIVE);
    return s;
}

__thread int cs_live_replaying __attribute__((tls_model("initial-exec")));

uint32_t cs_live_put(unsigned p, const cs_event *origin, uint64_t bytes)
{
    if (p >= CS_LIVE_POOLS || cs_live_replaying || !cs_trace_started())
        return 0;
    pool *pl = pools[p];
    if (!pl && !(pl = pools[p] = cs_calloc(1, sizeof *pl)))
        return 0;
    if (pl->gen != cs_trace_gen()) { /* a new file (a forked child): start over */
        pl->nrecs = 0;
        pl->free_head = 0;
        pl->gen = cs_trace_gen();
    }
    if (!pl->free_head && grow(pl) != 0)
        return 0;
    uint32_t idx = pl->free_head - 1;
    cs_live_slot *s = &pl->recs[idx / SLOTS_PER_REC][idx % SLOTS_PER_REC];
    pl->free_head = (uint32_t)s->bytes;
    cs_live_fill(s, origin, bytes);
    return make_id(p, idx);
}

void cs_live_consumed(uint32_t id, uint32_t stack)
{
    cs_live_slot *s = slot_of(id);
    if (s)
        s->consume_stack = stack;
}

void cs_live_drop(uint32_t id)
{
    cs_live_slot *s = slot_of(id);
    if (!s)
        return;
    pool *pl = pools[id >> 26];
    atomic_store_explicit((_Atomic uint64_t *)&s->obj, 0, memory_order_release);
    s->bytes = pl->free_head;
    pl->free_head = (id & ((1u << 26) - 1));
}
