/* Unit tests of preload/dlpack/dataindex.c, the consumed-data index: its
 * range lookups (a few granules through the hash, a long range through the
 * treap and the youngest entries that wait to go in) give exactly the keys
 * a brute-force walk over what was added and not removed gives, through
 * random adds, repeated adds and removes, and
 * its hull of data starts (free()'s unlocked pre-test) covers every start
 * and empties with the index. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "check.h"

#include "../../preload/dlpack/dataindex.c"

#define N 3000

static struct {
    uint64_t data, key;
    int n;
} ref[N];

static uint64_t rng = 0x9e3779b97f4a7c15ull;
static uint64_t next_rand(void)
{
    rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
    return rng;
}

/* the keys whose start lies in [lo, hi), from the reference */
static size_t ref_in(uint64_t lo, uint64_t hi, uint64_t *keys, size_t max)
{
    size_t n = 0;
    for (size_t i = 0; i < N; i++) {
        if (ref[i].n <= 0 || ref[i].data < lo || ref[i].data >= hi)
            continue;
        size_t k = 0;
        while (k < n && keys[k] != ref[i].key)
            k++;
        if (k == n && n < max)
            keys[n++] = ref[i].key;
    }
    return n;
}

static int same_set(const uint64_t *a, size_t na, const uint64_t *b, size_t nb)
{
    if (na != nb)
        return 0;
    for (size_t i = 0; i < na; i++) {
        size_t j = 0;
        while (j < nb && b[j] != a[i])
            j++;
        if (j == nb)
            return 0;
    }
    return 1;
}

static void check_ranges(int round)
{
    for (int q = 0; q < 200; q++) {
        uint64_t lo = 0x10000000 + next_rand() % (1u << 22);
        /* a few bytes up to a few MiB: both lookups */
        uint64_t len = q % 3 == 0 ? 1 + next_rand() % 600 : 1 + next_rand() % (1u << 22);
        uint64_t got[64], want[64];
        size_t ng = cs_di_starts_in(lo, lo + len, got, 64);
        size_t nw = ref_in(lo, lo + len, want, 64);
        if (nw < 64)
            CHECK(same_set(got, ng, want, nw), "round %d [%#llx, +%llu): %zu keys, want %zu", round,
                  (unsigned long long)lo, (unsigned long long)len, ng, nw);
        else
            CHECK(ng == 64, "round %d: a full answer", round);
    }
}

int main(void)
{
    for (size_t i = 0; i < N; i++) {
        /* starts spread over 4 MiB, some shared by two tensors */
        ref[i].data = 0x10000000 + (next_rand() % (1u << 22) & ~(uint64_t)15);
        if (i && next_rand() % 8 == 0)
            ref[i].data = ref[i - 1].data;
        ref[i].key = 0x7f0000000000ull + i * 64;
    }
    for (int round = 0; round < 6; round++) {
        for (size_t i = 0; i < N; i++) {
            unsigned r = (unsigned)(next_rand() % 4);
            if (r == 0 && ref[i].n > 0) {
                cs_di_remove(ref[i].data, ref[i].key);
                ref[i].n--;
            } else if (r == 1 && ref[i].n < 2) {
                cs_di_add(ref[i].data, ref[i].key); /* counted: a second add too */
                ref[i].n++;
            }
        }
        check_ranges(round);
        uint64_t lo = UINT64_MAX, hi = 0;
        for (size_t i = 0; i < N; i++)
            if (ref[i].n > 0) {
                lo = ref[i].data < lo ? ref[i].data : lo;
                hi = ref[i].data > hi ? ref[i].data : hi;
            }
        CHECK(cs_di_lo <= lo && cs_di_hi >= hi, "round %d: the hull covers every start", round);
    }
    for (size_t i = 0; i < N; i++)
        while (ref[i].n > 0) {
            cs_di_remove(ref[i].data, ref[i].key);
            ref[i].n--;
        }
    uint64_t k[4];
    CHECK(cs_di_starts_in(0, UINT64_MAX, k, 4) == 0, "empty at the end");
    CHECK(root == 0 && npend == 0, "the treap and the waiting entries are empty");
    CHECK(cs_di_lo == UINT64_MAX && cs_di_hi == 0, "no hull once empty");
    printf("dataindex: %d checks, %d failed\n", checks, failures);
    return failures != 0;
}
