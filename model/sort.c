/* A stable merge sort (see sort.h): runs of RUN elements sorted by
 * insertion, then merged pairwise, bottom up, between the array and a
 * buffer as large. */
#include "sort.h"

#include <string.h>

#include "alloc.h"

#define RUN 16

typedef int (*cmp_fn)(const void *, const void *);

static void swap_bytes(char *a, char *b, size_t size)
{
    for (size_t i = 0; i < size; i++) {
        char t = a[i];
        a[i] = b[i];
        b[i] = t;
    }
}

/* [lo, hi) by insertion; tmp holds one element, or is NULL (then by
 * swaps: the sort without a buffer) */
static void insertion(char *lo, char *hi, size_t size, cmp_fn cmp, char *tmp)
{
    for (char *p = lo + size; p < hi; p += size) {
        char *q = p;
        if (!tmp) {
            for (; q > lo && cmp(q - size, q) > 0; q -= size)
                swap_bytes(q - size, q, size);
            continue;
        }
        if (cmp(q - size, p) <= 0)
            continue;
        memcpy(tmp, p, size);
        do {
            q -= size;
        } while (q > lo && cmp(q - size, tmp) > 0);
        memmove(q + size, q, (size_t)(p - q));
        memcpy(q, tmp, size);
    }
}

/* src [a, m) and [m, b) (byte offsets) merged into dst at a; the left one
 * first among equals */
static void merge(const char *src, char *dst, size_t a, size_t m, size_t b, size_t size,
                  cmp_fn cmp)
{
    size_t i = a, j = m, k = a;
    while (i < m && j < b) {
        if (cmp(src + j, src + i) < 0) {
            memcpy(dst + k, src + j, size);
            j += size;
        } else {
            memcpy(dst + k, src + i, size);
            i += size;
        }
        k += size;
    }
    memcpy(dst + k, src + i, m - i);
    k += m - i;
    memcpy(dst + k, src + j, b - j);
}

void cs_sort(void *base, size_t n, size_t size, int (*cmp)(const void *, const void *))
{
    if (n < 2 || !size)
        return;
    char *a = base;
    size_t total = n * size;
    if (total / size != n)
        return; /* no such array */
    char *buf = n > RUN ? cs_malloc(total) : NULL;
    char one[64];
    char *tmp = buf ? buf : size <= sizeof one ? one : NULL;
    if (!buf && n > RUN) {
        insertion(a, a + total, size, cmp, tmp); /* out of memory: slow, still right */
        return;
    }
    size_t run = RUN * size;
    for (size_t lo = 0; lo < total; lo += run)
        insertion(a + lo, a + (total - lo < run ? total : lo + run), size, cmp, tmp);
    if (!buf)
        return;
    char *src = a, *dst = buf;
    for (size_t w = run; w < total; w *= 2) {
        for (size_t lo = 0; lo < total; lo += 2 * w) {
            size_t m = total - lo < w ? total : lo + w;
            size_t hi = total - lo < 2 * w ? total : lo + 2 * w;
            merge(src, dst, lo, m, hi, size, cmp);
        }
        char *t = src;
        src = dst;
        dst = t;
    }
    if (src != a)
        memcpy(a, src, total);
    cs_free(buf);
}
