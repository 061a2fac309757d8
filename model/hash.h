/* A 64-bit mix (the finalizer of MurmurHash3), for hash tables of the
 * report tool and the leak groups. */
#ifndef CAPSAN_HASH_H
#define CAPSAN_HASH_H

#include <stdint.h>

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
