/* The filter every free() reads first: one load tells a free() of an
 * ordinary block that no watcher cares. Below every watcher (dataguard.c's
 * consumed tensors' data, handlers.c's handler ctx, a re-export's check), so
 * none of them depends on another through it. */
#ifndef CAPSAN_FREEFILTER_H
#define CAPSAN_FREEFILTER_H

#include <stdatomic.h>
#include <stdint.h>

/* The filter every free() reads: a count per slot of 256-byte granules.
 * A block whose start lies in the granule where a live consumed tensor's
 * data starts, or in the one before, may hold that start (the data
 * itself, or a header of up to 256 bytes and then the data): both
 * granules' slots count the tensor. Other watchers mark the granule of an
 * address whose free() they must see (cs_ff_mark), so one load tells
 * every free() of an ordinary block that nobody cares. */
#define CS_FF_GRAIN 8
/* 262144 slots (512 KiB, touched only where a slot counts): with 10,000
 * consumed tensors alive one in 13 counts, and as many free()s of ordinary
 * blocks go on to the watchers (65536 slots: one in 4, W5's per-event
 * cost 6-7% above W2's; 4096 slots were all taken) */
#define CS_FF_BITS 18
extern _Atomic uint16_t cs_ff_pages[1u << CS_FF_BITS];
static inline unsigned cs_ff_page(uintptr_t granule)
{
    return (unsigned)(((uint64_t)granule * 0x9e3779b97f4a7c15ull) >> (64 - CS_FF_BITS));
}
/* the free() of a block at p may concern a watcher */
static inline int cs_ff_hit(uintptr_t p)
{
    return __builtin_expect(atomic_load_explicit(&cs_ff_pages[cs_ff_page(p >> CS_FF_GRAIN)],
                                                 memory_order_relaxed) != 0, 0);
}
/* Consumed tensors whose data is watched now. A block whose start lies
 * before the granule ahead of a data start's escapes the filter's counts
 * (an arena freed whole, its pieces lent out): while this is nonzero, a
 * free() of a block that reaches past the next granule is asked too
 * (dataguard.h's cs_dg_big), and when it is zero that costs one load. */
extern _Atomic uint32_t cs_ff_watched;
static inline int cs_ff_any(void)
{
    return __builtin_expect(atomic_load_explicit(&cs_ff_watched, memory_order_relaxed) != 0, 0);
}
/* free()'s test: p's slot counts, or some consumed tensor is watched (one
 * branch for both) */
static inline int cs_ff_free_hit(uintptr_t p)
{
    uint32_t n = atomic_load_explicit(&cs_ff_pages[cs_ff_page(p >> CS_FF_GRAIN)],
                                      memory_order_relaxed) |
                 atomic_load_explicit(&cs_ff_watched, memory_order_relaxed);
    return __builtin_expect(n != 0, 0);
}
/* From now on, a free() of a block at p passes the filter (for good). */
void cs_ff_mark(uintptr_t p);
/* the filter counts one more (+1) or one less (-1) at granule g */
static inline void cs_ff_count(uintptr_t granule, int sign)
{
    atomic_fetch_add_explicit(&cs_ff_pages[cs_ff_page(granule)], (uint16_t)sign,
                              memory_order_relaxed);
}

#endif
