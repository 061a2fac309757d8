/* Where capsan's own memory comes from: its tables, histories, findings,
 * stacks and the scratch arrays of the verdicts at exit.
 *
 * In the runtime (built with CS_OWNHEAP) from its own heap
 * (preload/core/ownheap.c, mmap'd apart from glibc's): a program that frees
 * a block twice may have corrupted glibc's heap, or freed a block glibc had
 * since handed to capsan, and capsan's verdicts and reports come after that
 * (issue 43). The command line tool, the unit tests and the sanitizer
 * builds of the runtime use malloc: nothing there shares a heap with a
 * buggy program, and ASan must see capsan's own blocks.
 *
 * Memory that goes to the program (a NEP 49 handler numpy holds) and the
 * program's own blocks stay malloc's. */
#ifndef CAPSAN_ALLOC_H
#define CAPSAN_ALLOC_H

#include <stddef.h>
#include <stdlib.h>
#include <string.h>

/* the runtime's own heap (preload/core/ownheap.c); defined in every build
 * of the runtime, used by those with CS_OWNHEAP */
void *cs_oh_malloc(size_t n);
void *cs_oh_calloc(size_t k, size_t n);
void *cs_oh_realloc(void *p, size_t n);
void cs_oh_free(void *p);
char *cs_oh_strdup(const char *s);

#ifdef CS_OWNHEAP
#define cs_malloc(n) cs_oh_malloc(n)
#define cs_calloc(k, n) cs_oh_calloc(k, n)
#define cs_realloc(p, n) cs_oh_realloc(p, n)
#define cs_free(p) cs_oh_free(p)
#define cs_strdup(s) cs_oh_strdup(s)
#else
#define cs_malloc(n) malloc(n)
#define cs_calloc(k, n) calloc(k, n)
#define cs_realloc(p, n) realloc(p, n)
#define cs_free(p) free(p)
#define cs_strdup(s) strdup(s)
#endif

#endif
