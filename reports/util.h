/* Small helpers of the report tool (not the runtime): allocation that
 * gives up cleanly, and (hash.h) a 64-bit hash for its tables. */
#ifndef CAPSAN_UTIL_H
#define CAPSAN_UTIL_H

#include <stddef.h>
#include <stdint.h>

#include "hash.h"

/* realloc/calloc/strndup that print "capsan: out of memory" and exit(1):
 * the report tool can do nothing useful without memory. */
void *cs_xrealloc(void *p, size_t n);
void *cs_xcalloc(size_t n, size_t size);
char *cs_xstrndup(const char *s, size_t n);

#endif
