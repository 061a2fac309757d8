/* Whether a pointer from someone else's struct is worth dereferencing: in
 * user space, past the zero page. Not a guarantee, a guard against the
 * obviously bad values that malformed DLPack structs and handlers carry. */
#ifndef CAPSAN_PLAUSIBLE_H
#define CAPSAN_PLAUSIBLE_H

#include <stdint.h>

static inline int cs_plausible(const void *p)
{
    uintptr_t a = (uintptr_t)p;
    return a >= 4096 && a < 0x800000000000ull;
}

#endif
