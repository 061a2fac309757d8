/* Per-thread runtime state, reached through one initial-exec TLS pointer
 * (small, so it fits the static TLS surplus when libcapsan.so is
 * dlopen'ed by `import capsan`). */
#ifndef CAPSAN_THREAD_H
#define CAPSAN_THREAD_H

#include <stdint.h>

struct cs_stack_cache;

typedef struct cs_thread {
    uint32_t num;           /* capsan's thread number, 1 = first seen */
    uint32_t written_gen;   /* trace generation its THREAD record is in */
    int busy;               /* inside capsan: hooks pass straight through */
    void *dtor_capsule;     /* capsule whose destructor runs on this thread */
    struct cs_stack_cache *cache;
    int importing;          /* the last captured stack ran inside an import */
} cs_thread;

/* This thread's state, created on first use; NULL if out of memory. */
cs_thread *cs_thread_get(void);
/* Write the THREAD record into the current trace file if not there yet. */
void cs_thread_note(cs_thread *t);
void cs_thread_init(void);

#endif
