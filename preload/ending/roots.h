/* Static-data roots, scanned once at exit.
 *
 * A block still alive at exit is a leak unless something the program keeps
 * for its whole life points to it. capsan looks where LeakSanitizer looks
 * first: the writable static data (.data, .bss, .got) of every loaded
 * object except capsan itself. Only exact pointers to a block's start
 * count, which is how caches hold blocks: numpy's small-block data cache
 * (numpy 1.24 alloc.c) keeps up to 7 freed blocks per size in .bss and
 * gives them back without telling tracemalloc, so they would otherwise
 * look leaked. Heap and stacks are not scanned. */
#ifndef CAPSAN_ROOTS_H
#define CAPSAN_ROOTS_H

#include <stddef.h>
#include <stdint.h>

#include "tracefmt.h"

/* key: the block; where: the word that holds it; base: that object's load
 * address (0 if none); region: CS_WHERE_* */
typedef void (*cs_root_cb)(void *ud, uint64_t key, uint64_t where, uint64_t base,
                           unsigned region);

/* The index of w in the sorted keys, or -1. */
static inline long cs_key_index(const uint64_t *keys, size_t n, uint64_t w)
{
    size_t lo = 0, hi = n;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (keys[mid] < w)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo < n && keys[lo] == w ? (long)lo : -1;
}

/* keys: sorted, n > 0. Calls cb once for each key found; returns how many
 * were found. */
size_t cs_roots_scan(const uint64_t *keys, size_t n, cs_root_cb cb, void *ud);

#endif
