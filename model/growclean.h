/* Growing an array that holds object addresses (keys, findings, held
 * tensors). realloc leaves the old block behind with those addresses in
 * it, and the leak scan at exit reads freed heap too, where a stale copy
 * of an address is a root (preload/ending/reach.c): a leaked object would look
 * referenced. The old block is cleared before it is freed, and so is any
 * such block a caller frees (cs_free_clean). */
#ifndef CAPSAN_GROWCLEAN_H
#define CAPSAN_GROWCLEAN_H

#include <stdlib.h>
#include <string.h>

#include "alloc.h"

/* cs_free(p) with its first n bytes cleared. explicit_bzero, not memset: a
 * store right before free() is dead to the compiler, which drops it. */
static inline void cs_free_clean(void *p, size_t n)
{
    if (p)
        explicit_bzero(p, n);
    cs_free(p);
}

/* A block of `size` bytes holding the first `used` bytes of old (freed,
 * cleared); NULL, and old untouched, when there is no memory. */
static inline void *cs_grow_clean(void *old, size_t used, size_t size)
{
    void *nb = cs_malloc(size);
    if (nb && old) {
        memcpy(nb, old, used);
        cs_free_clean(old, used);
    }
    return nb;
}

#endif
