/* Small helpers of the report tool (not the runtime): allocation that
 * gives up cleanly, and a 64-bit hash for its tables. */
#ifndef CAPSAN_UTIL_H
#define CAPSAN_UTIL_H

#include <stddef.h>
#include <stdint.h>

/* realloc/calloc/strndup that print "capsan: out of memory" and exit(1):
 * the report tool can do nothing useful without memory. */
void *cs_xrealloc(void *p, size_t n);
void *cs_xcalloc(size_t n, size_t size);
char *cs_xstrndup(const char *s, size_t n);

/* A 64-bit mix (the finalizer of MurmurHash3). */
static inline uint64_t cs_hash64(uint64_t x)
{
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdull;
    x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53ull;
    x ^= x >> 33;
    return x;
}

#endif
