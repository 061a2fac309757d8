/* A set of keys seen once, for findings said once per place (a call site
 * without the GIL, an exchange-API contract broken at a call site): open
 * addressing under a spin lock. Only failing paths reach it. */
#ifndef CAPSAN_SEENSET_H
#define CAPSAN_SEENSET_H

#include <stddef.h>
#include <stdint.h>

#include "spin.h"

/* 1 the first time key (non-zero) is offered to the set of n slots (a
 * full set answers 1: said again rather than never) */
static inline int cs_seen_first(uintptr_t *slots, size_t n, cs_spin *mu, uintptr_t key)
{
    int fresh = 1;
    cs_spin_lock(mu);
    for (size_t i = (key >> 4) % n, k = 0; k < n; i = (i + 1) % n, k++) {
        if (slots[i] == key) {
            fresh = 0;
            break;
        }
        if (!slots[i]) {
            slots[i] = key;
            break;
        }
    }
    cs_spin_unlock(mu);
    return fresh;
}

#endif
