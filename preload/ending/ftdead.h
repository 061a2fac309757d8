/* Dead objects in a free-threaded build's memory, as the _exit scan sees
 * them. There are no pymalloc pools there (pypools.h): objects live in
 * mimalloc pages, and a freed object's block keeps its words but the
 * first (mimalloc's free-list link is written over ob_tid). A stale word
 * in such a block may equal a leaked tensor's address, as in a pymalloc
 * pool's free block: it keeps nothing alive. */
#ifndef CAPSAN_FTDEAD_H
#define CAPSAN_FTDEAD_H

#include <stddef.h>
#include <stdint.h>

/* The word at w[k] (a copy of memory; w[0..k] is in it) lies inside a
 * dead object: the nearest object head at or before it (its type word a
 * type object's address, the object's fixed size covering w[k]) has both
 * its thread-local and its shared refcount at 0, as CPython leaves an
 * object it deallocates. ob_type_off: 24 (the free-threaded head); k is
 * looked back at most CS_FTDEAD_BACK words. type_type: &PyType_Type.
 * 0 whenever it cannot tell: the word then counts, as it must. */
#define CS_FTDEAD_BACK 64
int cs_ft_word_in_dead_object(const uint64_t *w, size_t k, uintptr_t type_type,
                              size_t ob_type_off);

#endif
