/* dlpack-data-freed: memory that a consumed, undeleted tensor's data
 * points into is freed (free(), PyMem_Free()). The consumer still holds
 * the DLManagedTensor and reads whatever the allocator puts there next. */
#ifndef CAPSAN_DATAGUARD_H
#define CAPSAN_DATAGUARD_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "freefilter.h"
#include "got.h"

/* Watch consumed tensors from now on (the lifecycle's data watch). */
void cs_dg_init(void);
/* PyMem_Free's original was found: cs_dg_hooks may be installed. */
int cs_dg_hooks_ready(void);

void cs_dg_check_slow(uintptr_t p, unsigned how);
/* p is being freed by `how` (CS_FREED_*): free() of a malloc block (its
 * whole usable size counts), or PyMem_Free (p itself counts). */
static inline void cs_dg_check(uintptr_t p, unsigned how)
{
    if (cs_ff_hit(p))
        cs_dg_check_slow(p, how);
}

extern const cs_hook cs_dg_hooks[];
extern const int cs_dg_nhooks;

#endif
