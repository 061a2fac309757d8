/* Reachability at _exit, in the spirit of LeakSanitizer: is an object's
 * start address stored anywhere the program can still reach?
 *
 * Scanned: every private writable mapping of the process (data segments of
 * loaded objects, the heap, anonymous mappings, other threads' stacks),
 * its resident pages only. The calling thread, in _exit, is left out: its
 * stack is the interpreter's way there, full of stale words.
 * Not scanned: shared mappings (capsan's trace), capsan's own library and
 * the memory capsan registers as its own (cs_reach_own), which holds every
 * key, and free memory of the interpreter's small-object pools: free
 * blocks, never-carved tails, dead free-listed objects (pypools.h). Other
 * threads' registers are not seen. Conservative, as a scan must be: a
 * stale copy of a pointer in live memory makes an object reachable. */
#ifndef CAPSAN_REACH_H
#define CAPSAN_REACH_H

#include <stddef.h>
#include <stdint.h>

#include "roots.h"

typedef struct cs_reach cs_reach;

/* A scan of the keys (sorted, n > 0); NULL out of memory. */
cs_reach *cs_reach_new(const uint64_t *keys, size_t n);
/* [p, p + n) is capsan's own memory: not scanned. */
void cs_reach_own(void *reach, const void *p, size_t n);
/* Scan; cb once per key found (where = the word, base = 0). Returns how
 * many keys were found, and frees the scan. */
size_t cs_reach_run(cs_reach *r, cs_root_cb cb, void *ud);

#endif
