/* The runtime's own heap: every block of capsan's own (model/alloc.h's
 * cs_malloc and kin) comes from anonymous mappings of its own, never from
 * the program's malloc. After a double free or a use after free the
 * program may have corrupted glibc's heap, or freed a block glibc had
 * handed to capsan in the meantime (a released tensor's data, reused for a
 * table of capsan's and then freed again by the buggy deleter): capsan's
 * tables, verdicts and reports must not stand on that heap (issue 43).
 *
 * Size classes of 16 bytes up to 128, then four a doubling up to 32 KiB,
 * each with its own free list and lock; blocks carved from arenas that
 * are never given back. A larger block is a mapping of its own. Every
 * block has a 16-byte header before it (its class and size), so a block
 * freed twice, or a pointer that is not capsan's, is told and left alone
 * rather than corrupting the lists. Thread-safe (spin locks, held for a
 * few instructions), fork-safe (cs_oh_fork_lock), no glibc malloc. */
#ifndef CAPSAN_OWNHEAP_H
#define CAPSAN_OWNHEAP_H

#include <stddef.h>

#include "alloc.h" /* cs_oh_malloc, cs_oh_calloc, cs_oh_realloc, cs_oh_free, cs_oh_strdup */

/* bytes the block at p (one of cs_oh_malloc's) can hold */
size_t cs_oh_usable(const void *p);
/* fork(): every lock of the heap held across it (1 before, 0 after, in
 * the parent and the child). Innermost: nothing is locked under them. */
void cs_oh_fork_lock(int lock);
/* Tell fn each mapping of the heap, blocks free or not (the leak scan at
 * exit leaves them out: they hold every key capsan knows). fn may
 * allocate from the heap. */
void cs_oh_own_memory(void (*fn)(void *ud, const void *p, size_t n), void *ud);

#endif
