/* The sort model/ and the runtime use instead of qsort. glibc's qsort
 * (2.36, Debian 12's) takes its merge buffer from malloc for arrays over
 * 1 KiB, and at exit that may be a heap the program corrupted (alloc.h);
 * glibc 2.37 and later sort in place, unstably, so equal elements could
 * come out in another order there. This one is stable everywhere and takes
 * its buffer from cs_malloc. */
#ifndef CAPSAN_SORT_H
#define CAPSAN_SORT_H

#include <stddef.h>

/* qsort's contract, stable: equal elements keep their order */
void cs_sort(void *base, size_t n, size_t size, int (*cmp)(const void *, const void *));

#endif
