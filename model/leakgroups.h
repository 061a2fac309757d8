/* Leaks grouped as LeakSanitizer groups them: by kind and the stack of
 * their first event (where the object was allocated or exported), with a
 * count, the bytes, and the oldest one as the example. Stacks that print
 * the same are one (the interpreter's first call of a line and its
 * specialized later ones differ only in its own frames, which the report
 * leaves out: cs_stack_display_key). Shared by the runtime's exit report
 * and `capsan report`. */
#ifndef CAPSAN_LEAKGROUPS_H
#define CAPSAN_LEAKGROUPS_H

#include <stddef.h>
#include <stdint.h>

#include "lifecycle.h"

typedef struct cs_leak_group {
    int used;
    uint16_t kind;
    uint8_t evkind;
    uint64_t where;       /* the first event's cs_stack_display_key */
    unsigned count;
    uint64_t bytes;
    unsigned ind_count;   /* indirect leaks of the group's findings */
    uint64_t ind_bytes;
    size_t seq;
    cs_finding first;
} cs_leak_group;

typedef struct cs_leak_groups {
    cs_leak_group *tab;
    size_t cap, n;
} cs_leak_groups;

/* Add a leak finding whose first event's stack has display key `where`;
 * -1 when out of memory (nothing added). */
int cs_lg_add(cs_leak_groups *g, const cs_finding *f, uint64_t where);
/* The groups, errors first, then most bytes (then most objects, then first seen);
 * *out is cs_malloc'd, the caller cs_frees it. Returns how many (0: none,
 * or out of memory). */
size_t cs_lg_sorted(const cs_leak_groups *g, const cs_leak_group ***out);
/* Empty (keeps the table), and free it. */
void cs_lg_clear(cs_leak_groups *g);
void cs_lg_free(cs_leak_groups *g);

#endif
