/* Integer mixes for hash tables of the report tool and the leak groups. */
#ifndef CAPSAN_HASH_H
#define CAPSAN_HASH_H

#include <stdint.h>

/* A 64-bit mix (the finalizer of MurmurHash3) */
static inline uint64_t cs_hash64(uint64_t x)
{
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdull;
    x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53ull;
    x ^= x >> 33;
    return x;
}

/* A 32-bit mix (lowbias32), for 32-bit keys: stack and code ids */
static inline uint32_t cs_hash32(uint32_t x)
{
    x ^= x >> 16;
    x *= 0x7feb352dU;
    x ^= x >> 15;
    x *= 0x846ca68bU;
    x ^= x >> 16;
    return x;
}

#endif
