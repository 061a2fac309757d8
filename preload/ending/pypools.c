/* pymalloc pools seen by the _exit scan (see pypools.h). Reads only its
 * copy of a pool and, for a type, process_vm_readv: a word that is not an
 * address faults nothing. */
#include "pypools.h"

#include "peek.h"

#include <string.h>

/* struct pool_header of obmalloc.c (3.10-3.13), 48 bytes */
#define OVERHEAD 48u
#define NCLASSES 32u /* 512-byte threshold, 16-byte alignment */

static uint32_t u32(const unsigned char *p, size_t off)
{
    uint32_t v;
    memcpy(&v, p + off, sizeof v);
    return v;
}

static uint64_t u64(const unsigned char *p, size_t off)
{
    uint64_t v;
    memcpy(&v, p + off, sizeof v);
    return v;
}

int cs_pool_parse(const unsigned char *copy, uintptr_t at, cs_pool *out)
{
    uint32_t count = u32(copy, 0), szidx = u32(copy, 36);
    uint32_t next = u32(copy, 40), maxnext = u32(copy, 44);
    uint64_t freeblock = u64(copy, 8);
    if (szidx >= NCLASSES)
        return 0;
    uint32_t bs = (szidx + 1) * 16;
    /* a header obmalloc wrote, not any 16 KiB of memory: these hold
     * together for no other data but by rare chance */
    if (maxnext != CS_POOL_SIZE - bs || next < OVERHEAD + bs || next > CS_POOL_SIZE ||
        (next - OVERHEAD) % bs)
        return 0;
    uint32_t carved = (next - OVERHEAD) / bs;
    if (count > carved)
        return 0;
    if (freeblock && (freeblock < at + OVERHEAD || freeblock >= at + next ||
                      (freeblock - at - OVERHEAD) % bs))
        return 0;
    out->bs = bs;
    out->first = OVERHEAD;
    out->end = count ? next : 0; /* empty: every block is free */
    memset(out->free, 0, sizeof out->free);
    /* the free list, each link in the first word of a free block; a link
     * that leaves the pool or comes back ends the walk (what is left is
     * scanned: conservative) */
    for (uint64_t p = freeblock; p;) {
        if (p < at + OVERHEAD || p >= at + next || (p - at - OVERHEAD) % bs)
            break;
        uint32_t k = (uint32_t)((p - at - OVERHEAD) / bs);
        if (cs_pool_block_free(out, k))
            break;
        out->free[k >> 3] |= (uint8_t)(1u << (k & 7));
        p = u64(copy, p - at);
    }
    return 1;
}

int cs_pool_block_dead(const uint64_t *w, size_t nwords, uintptr_t type_type)
{
    if (!type_type)
        return 0;
    /* ob_refcnt at 0 (a plain object), 2 (after PyGC_Head), 4 (after the
     * managed dict and values words of 3.11+): the first type word met
     * says where the object's head is (a live object's field may be 0 and
     * the next one a type) */
    for (size_t i = 0; i <= 4 && i + 1 < nwords; i += 2)
        if (w[i + 1] && cs_peek_is_type(w[i + 1], type_type, 8))
            return w[i] == 0;
    return 0;
}
