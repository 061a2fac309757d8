/* The interpreter's small-object pools (pymalloc) as the _exit scan sees
 * them: which blocks of a pool hold memory the program still uses.
 *
 * A pool's free blocks keep the words of the object freed there, and so
 * does the never-carved tail of a pool reused for another size, and a
 * dead object parked on a type's free list (a dict, a tuple: its
 * refcount 0, its fields as they were). A stale word there may equal the
 * address of an object allocated since (a leaked tensor at a reused
 * address), and how often depends on the run's timing and layout.
 * LeakSanitizer never scans free memory: neither does the scan. */
#ifndef CAPSAN_PYPOOLS_H
#define CAPSAN_PYPOOLS_H

#include <stddef.h>
#include <stdint.h>

/* the pool size of CPython 3.10+ on 64-bit (radix tree, large pools) */
#define CS_POOL_SIZE 16384u

typedef struct cs_pool {
    uint32_t bs;         /* block size */
    uint32_t first, end; /* carved blocks: [first, end) offsets in the pool */
    uint8_t free[CS_POOL_SIZE / 16 / 8]; /* one bit per block, set: free */
} cs_pool;

/* `copy` holds the CS_POOL_SIZE bytes at `at` (aligned). 1 and *out
 * filled if they are a pymalloc pool in use, 0 if not a pool or an empty
 * one (*out->end == 0: nothing in it is used). */
int cs_pool_parse(const unsigned char *copy, uintptr_t at, cs_pool *out);

/* Is block k of the pool free? */
static inline int cs_pool_block_free(const cs_pool *p, uint32_t k)
{
    return p->free[k >> 3] >> (k & 7) & 1;
}

/* Is the block (its words, a copy) a dead object on a free list: a
 * refcount of 0 followed by a type, at the start of the object or after
 * its GC header (and the managed dict's pre-header of 3.11+)?
 * type_type: &PyType_Type (0: cannot tell, never dead). */
int cs_pool_block_dead(const uint64_t *w, size_t nwords, uintptr_t type_type);

#endif
