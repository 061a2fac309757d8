/* dlpack-data-freed: memory that a consumed, undeleted tensor's data
 * points into is freed (free(), PyMem_Free()). The consumer still holds
 * the DLManagedTensor and reads whatever the allocator puts there next. */
#ifndef CAPSAN_DATAGUARD_H
#define CAPSAN_DATAGUARD_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "got.h"

/* Watch consumed tensors from now on (the lifecycle's data watch). */
void cs_dg_init(void);
/* PyMem_Free's original was found: cs_dg_hooks may be installed. */
int cs_dg_hooks_ready(void);

/* The filter every free() reads: a count per slot of 256-byte granules.
 * A block whose start lies in the granule where a live consumed tensor's
 * data starts, or in the one before, may hold that start (the data
 * itself, or a header of up to 256 bytes and then the data): both
 * granules' slots count the tensor. Other watchers mark the granule of an
 * address whose free() they must see (cs_dg_mark), so one load tells
 * every free() of an ordinary block that nobody cares. */
#define CS_DG_GRAIN 8
/* 65536 slots (128 KiB): with 10,000 consumed tensors alive a quarter of
 * them count one (4096 slots were all taken, and every free() went on) */
#define CS_DG_BITS 16
extern _Atomic uint16_t cs_dg_pages[1u << CS_DG_BITS];
static inline unsigned cs_dg_page(uintptr_t granule)
{
    return (unsigned)(((uint64_t)granule * 0x9e3779b97f4a7c15ull) >> (64 - CS_DG_BITS));
}
/* the free() of a block at p may concern a watcher */
static inline int cs_dg_hit(uintptr_t p)
{
    return __builtin_expect(atomic_load_explicit(&cs_dg_pages[cs_dg_page(p >> CS_DG_GRAIN)],
                                                 memory_order_relaxed) != 0, 0);
}
/* From now on, a free() of a block at p passes the filter (for good). */
void cs_dg_mark(uintptr_t p);
void cs_dg_check_slow(uintptr_t p, unsigned how);
/* p is being freed by `how` (CS_FREED_*): free() of a malloc block (its
 * whole usable size counts), or PyMem_Free (p itself counts). */
static inline void cs_dg_check(uintptr_t p, unsigned how)
{
    if (cs_dg_hit(p))
        cs_dg_check_slow(p, how);
}

extern const cs_hook cs_dg_hooks[];
extern const int cs_dg_nhooks;

#endif
