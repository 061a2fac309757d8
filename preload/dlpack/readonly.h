/* dlpack-read-only-dropped: a consumer that re-exports memory it consumed
 * from a READ_ONLY versioned tensor, in a tensor without the flag (or a
 * legacy one, which cannot carry it): the next consumer may write into
 * read-only memory (a file mapping: SIGSEGV). Told at the re-export. */
#ifndef CAPSAN_READONLY_H
#define CAPSAN_READONLY_H

#include <stdatomic.h>
#include <stdint.h>

#include "deleter.h"
#include "dltensor.h"
#include "freefilter.h"

/* Set once a READ_ONLY versioned tensor was exported: until then no
 * export can drop the flag, and the check below costs one load. Sticky
 * (a count would need the struct at its release, when it may be gone). */
extern _Atomic int cs_dl_ro_seen;

void cs_dl_ro_slow(const cs_loan *l, uint32_t stack);

/* of a struct known readable (an export being followed, a held tensor) */
static inline int cs_dl_ro_flag(const void *mt, int versioned)
{
    return versioned && (*(const uint64_t *)((const char *)mt + CS_DLV_FLAGS_OFF) & CS_DLV_READ_ONLY);
}

/* l was just exported (its EXPORT event has `stack`) */
static inline void cs_dl_ro_check(const cs_loan *l, uint32_t stack)
{
    if (__builtin_expect(!atomic_load_explicit(&cs_dl_ro_seen, memory_order_relaxed), 1))
        return;
    if (!cs_dl_ro_flag(l->mt, l->versioned) && cs_ff_hit((uintptr_t)l->data))
        cs_dl_ro_slow(l, stack);
}

/* at an export: remember that read-only memory is in play */
static inline void cs_dl_ro_note(const cs_loan *l)
{
    if (cs_dl_ro_flag(l->mt, l->versioned) && !atomic_load_explicit(&cs_dl_ro_seen, memory_order_relaxed))
        atomic_store_explicit(&cs_dl_ro_seen, 1, memory_order_relaxed);
}

#endif
