/* Where consumed tensors' data starts: an index from a data start to the
 * tensors (DLManagedTensor addresses) consumed with it and not yet released.
 * A re-export's "is this memory a consumed tensor's?" and a watched free()'s
 * "whose data was in this block?" are lookups here, not walks over every
 * object capsan knows: their cost does not grow with what is alive. Fed by
 * the lifecycle's data watch (dataguard.c) under the tensor's own lock; its
 * lock is taken last and held for no other. */
#ifndef CAPSAN_DATAINDEX_H
#define CAPSAN_DATAINDEX_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

/* The lowest and highest data start indexed (while any is: the hull only
 * widens until the index is empty). free()'s hook reads them, unlocked, to
 * let a block that lies outside them go on at once. */
extern _Atomic uint64_t cs_di_lo, cs_di_hi;

/* tensor `key`'s data starts at `data` (counted: the same pair may be
 * added twice while a tensor moves from a thread's young table to the
 * lifecycle) */
void cs_di_add(uint64_t data, uint64_t key);
void cs_di_remove(uint64_t data, uint64_t key);
/* The tensors whose data starts in [lo, hi), up to max into keys; returns
 * how many. Each key once. */
size_t cs_di_starts_in(uint64_t lo, uint64_t hi, uint64_t *keys, size_t max);
/* its chunks, which hold the keys of live tensors: the leak scan skips them */
void cs_di_own_memory(void (*fn)(void *ud, const void *p, size_t n), void *ud);
/* held across fork() (the last lock of fork_prepare) */
void cs_di_fork_lock(int lock);

#endif
