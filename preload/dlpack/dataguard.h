/* dlpack-data-freed: memory that a consumed, undeleted tensor's data
 * points into is freed (free(), PyMem_Free()). The consumer still holds
 * the DLManagedTensor and reads whatever the allocator puts there next. */
#ifndef CAPSAN_DATAGUARD_H
#define CAPSAN_DATAGUARD_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "dataindex.h"
#include "freefilter.h"
#include "got.h"

/* Watch consumed tensors from now on (the lifecycle's data watch). */
void cs_dg_init(void);
/* PyMem_Free's original was found: cs_dg_hooks may be installed. */
int cs_dg_hooks_ready(void);

/* the process's malloc is glibc's: a block's size is the word before it */
extern int cs_dg_glibc;
size_t cs_dg_usable(uintptr_t p); /* malloc_usable_size */

/* A malloc block at p may reach a consumed tensor's data start
 * that the filter did not count for it: one past the granule after p's.
 * With no consumed tensor watched, one load. Otherwise glibc's chunk size
 * (an upper bound of the usable size: one load beside the word free()
 * reads next) or, under another allocator, its malloc_usable_size. */
static inline int cs_dg_big(uintptr_t p)
{
    if (!cs_ff_any())
        return 0;
    if (p - 1 >= atomic_load_explicit(&cs_di_hi, memory_order_relaxed))
        return 0; /* every start lies before the block (or p is NULL) */
    size_t reach = 512 - (p & 255); /* from p to the end of the next granule */
    size_t size = __builtin_expect(cs_dg_glibc, 1) ? *(const size_t *)(p - 8) & ~(size_t)7
                                                   : cs_dg_usable(p);
    return size > reach && p + size > atomic_load_explicit(&cs_di_lo, memory_order_relaxed);
}

void cs_dg_check_slow(uintptr_t p, unsigned how);
/* p is being freed by `how` (CS_FREED_*): free() of a malloc block (its
 * whole usable size counts: free()'s hook asks cs_dg_big too), or
 * PyMem_Free (p itself counts). */
static inline void cs_dg_check(uintptr_t p, unsigned how)
{
    if (cs_ff_hit(p))
        cs_dg_check_slow(p, how);
}

extern const cs_hook cs_dg_hooks[];
extern const int cs_dg_nhooks;

#endif
