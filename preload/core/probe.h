/* Whether foreign memory can be touched: a capsule may carry any pointer,
 * and a DLTensor any shape or strides pointer. A fault there would be
 * capsan's, not the program's. */
#ifndef CAPSAN_PROBE_H
#define CAPSAN_PROBE_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

/* Pages once proven readable (direct-mapped; entry = page << 2 | 1, and
 * | 2 once proven writable). Internal to the probes below. */
#define CS_PROBE_PAGES 1024
extern _Atomic uintptr_t cs_probe_known[CS_PROBE_PAGES];

static inline _Atomic uintptr_t *cs_probe_entry(uintptr_t page)
{
    return &cs_probe_known[(page ^ (page >> 10)) & (CS_PROBE_PAGES - 1)];
}

int cs_probe_read_slow(const void *p, size_t n);

/* 1 if the n bytes at p can be read. The usual case, a range within one
 * remembered page, is a load and a compare; otherwise the kernel is asked
 * (process_vm_readv fails with EFAULT where a load would fault). */
static inline int cs_probe_read(const void *p, size_t n)
{
    uintptr_t a = (uintptr_t)p, pg = a >> 12;
    if (n && ((a + n - 1) >> 12) == pg &&
        (atomic_load_explicit(cs_probe_entry(pg), memory_order_relaxed) & ~(uintptr_t)2) ==
            (pg << 2 | 1))
        return 1;
    return cs_probe_read_slow(p, n);
}

/* *slot = val, unless slot cannot be written (then 0 and nothing done). */
int cs_probe_store(void **slot, void *val);

#endif
