/* Report-tool helpers (see util.h). */
#include "util.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void *check(void *p)
{
    if (!p) {
        fputs("capsan: out of memory\n", stderr);
        exit(1);
    }
    return p;
}

void *cs_xrealloc(void *p, size_t n) { return check(realloc(p, n ? n : 1)); }

void *cs_xcalloc(size_t n, size_t size) { return check(calloc(n ? n : 1, size ? size : 1)); }

char *cs_xstrndup(const char *s, size_t n)
{
    char *d = cs_xrealloc(NULL, n + 1);
    memcpy(d, s, n);
    d[n] = 0;
    return d;
}
