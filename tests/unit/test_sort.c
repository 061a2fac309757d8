/* Unit tests of model/sort.c, the stable sort that replaces qsort: for
 * every length up to a few runs and merges, and a large one, with elements
 * of several sizes, the order is qsort's and equal keys keep the order
 * they came in. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "sort.h"

typedef struct item {
    uint32_t key, seq; /* seq: the position it came in */
    char pad[40];      /* a leak_ref-sized element */
} item;

static int by_key(const void *a, const void *b)
{
    const item *x = a, *y = b;
    return (x->key > y->key) - (x->key < y->key);
}

static int by_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return (x > y) - (x < y);
}

static uint64_t rng = 0x9e3779b97f4a7c15ull;
static uint64_t next_rand(void)
{
    rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
    return rng;
}

static void items(size_t n, uint32_t keys)
{
    item *v = malloc((n + 1) * sizeof *v);
    for (size_t i = 0; i < n; i++)
        v[i] = (item){.key = (uint32_t)(next_rand() % keys), .seq = (uint32_t)i};
    cs_sort(v, n, sizeof *v, by_key);
    int ok = 1;
    for (size_t i = 1; i < n; i++)
        ok &= v[i - 1].key < v[i].key || (v[i - 1].key == v[i].key && v[i - 1].seq < v[i].seq);
    CHECK(ok, "%zu items, %u keys: sorted, equal keys in the order they came", n, keys);
    free(v);
}

static void words(size_t n)
{
    uint64_t *v = malloc((n + 1) * sizeof *v), *w = malloc((n + 1) * sizeof *w);
    for (size_t i = 0; i < n; i++)
        v[i] = w[i] = next_rand() >> (i % 3 ? 40 : 0);
    cs_sort(v, n, sizeof *v, by_u64);
    qsort(w, n, sizeof *w, by_u64);
    CHECK(!n || !memcmp(v, w, n * sizeof *v), "%zu words: qsort's order", n);
    free(v);
    free(w);
}

int main(void)
{
    for (size_t n = 0; n <= 300; n++) {
        items(n, 5);
        items(n, 1000);
        words(n);
    }
    items(100000, 100);
    words(100000);
    printf("test_sort: %d passed, %d failed\n", checks - failures, failures);
    return failures != 0;
}
