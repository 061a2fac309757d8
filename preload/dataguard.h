/* dlpack-data-freed: memory that a consumed, undeleted tensor's data
 * points into is freed (free(), PyMem_Free()). The consumer still holds
 * the DLManagedTensor and reads whatever the allocator puts there next. */
#ifndef CAPSAN_DATAGUARD_H
#define CAPSAN_DATAGUARD_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "got.h"

/* A consumer took the tensor mt, whose data spans [data, data + n). */
void cs_dg_consumed(void *mt, uintptr_t data, uint64_t n);
/* mt was released (its deleter is about to run): frees from here on are
 * its own. */
void cs_dg_released(void *mt);

/* The filter: one test per free. Pages that live consumed tensors' data
 * spans have a nonzero count. */
extern _Atomic uint16_t cs_dg_pages[4096];
static inline unsigned cs_dg_page(uintptr_t p)
{
    return (unsigned)(((uint64_t)(p >> 12) * 0x9e3779b97f4a7c15ull) >> 52);
}
void cs_dg_check_slow(uintptr_t p, unsigned how);
/* p is being freed by `how` (CS_FREED_*): free() of a malloc block (its
 * whole usable size counts), or PyMem_Free (p itself counts). */
static inline void cs_dg_check(uintptr_t p, unsigned how)
{
    if (__builtin_expect(atomic_load_explicit(&cs_dg_pages[cs_dg_page(p)], memory_order_relaxed) != 0, 0))
        cs_dg_check_slow(p, how);
}

extern const cs_hook cs_dg_hooks[];
extern const int cs_dg_nhooks;

#endif
