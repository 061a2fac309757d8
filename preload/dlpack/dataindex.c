/* The consumed-data index (see dataindex.h): a hash of 256-byte granules
 * of data starts, each bucket a chain of (start, tensor, count) entries,
 * and the same entries in a treap ordered by (start, tensor): a range of
 * a few granules is a few bucket lookups, a big block's range (an arena
 * freed whole) a walk down the treap, O(log n). A new entry waits among
 * the PEND youngest before it goes into the treap: most tensors are
 * released within a few events of their consume, and with thousands alive
 * a treap insert and removal cost about 350 instructions each (W5); a range
 * looks at the few waiting entries as well. Entries come from mmap'd
 * chunks and go back to a free list, never to free(): capsan's free() hook
 * reads this index, and the process's allocator may be the program's own. */
#include "dataindex.h"

#include <sys/mman.h>

#include "spin.h"

#define GRAIN 8
#define NB_BITS 16                 /* buckets: with 30,000 live tensors, chains < 1 */
#define NB (1u << NB_BITS)
#define CHUNK_BITS 12              /* entries a chunk */
#define NCHUNKS 4096               /* up to 16M entries */
/* a range of fewer granules than this is looked up bucket by bucket, a
 * longer one in the treap */
#define MAX_GRANULES 4

typedef struct entry {
    uint64_t data, key;
    uint32_t n;    /* times added less times removed */
    uint32_t next; /* the chain's (or the free list's) next, 0 = none */
    uint32_t l, r; /* the treap's children, 0 = none */
    uint32_t pend; /* its place among the waiting + 1, 0 = in the treap */
} entry;

/* the youngest entries, not in the treap yet (in no order) */
#define PEND 16
static uint32_t pend[PEND];
static unsigned npend, evict;

static cs_spin mu = CS_SPIN_INIT;
static uint32_t head[NB];
static entry *chunks[NCHUNKS];
static uint32_t nused = 1; /* entry 0 is "none" */
static uint32_t free_list;
static uint32_t root; /* the treap's */
_Atomic uint64_t cs_di_lo = UINT64_MAX, cs_di_hi;

static inline unsigned bucket_of(uint64_t granule)
{
    return (unsigned)((granule * 0x9e3779b97f4a7c15ull) >> (64 - NB_BITS));
}

static inline entry *at(uint32_t i)
{
    return &chunks[i >> CHUNK_BITS][i & ((1u << CHUNK_BITS) - 1)];
}

static uint32_t entry_new(void)
{
    if (free_list) {
        uint32_t i = free_list;
        free_list = at(i)->next;
        return i;
    }
    unsigned c = nused >> CHUNK_BITS;
    if (c >= NCHUNKS)
        return 0;
    if (!chunks[c]) {
        void *m = mmap(NULL, sizeof(entry) << CHUNK_BITS, PROT_READ | PROT_WRITE,
                       MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (m == MAP_FAILED)
            return 0;
        chunks[c] = m;
    }
    return nused++;
}

/* ---- the treap: ordered by (data, key), heap-ordered by a hash of the
 * entry's index (a fixed pseudo-random priority) ---- */
static inline uint32_t prio(uint32_t i)
{
    return (uint32_t)(((uint64_t)i * 0x9e3779b97f4a7c15ull) >> 32);
}

static inline int before(const entry *e, uint64_t data, uint64_t key)
{
    return e->data < data || (e->data == data && e->key < key);
}

/* t's entries before (data, key) into *lo, the rest into *hi */
static void split(uint32_t t, uint64_t data, uint64_t key, uint32_t *lo, uint32_t *hi)
{
    if (!t) {
        *lo = *hi = 0;
    } else if (before(at(t), data, key)) {
        split(at(t)->r, data, key, &at(t)->r, hi);
        *lo = t;
    } else {
        split(at(t)->l, data, key, lo, &at(t)->l);
        *hi = t;
    }
}

/* every entry of a before every entry of b */
static uint32_t merge(uint32_t a, uint32_t b)
{
    if (!a || !b)
        return a ? a : b;
    if (prio(a) > prio(b)) {
        at(a)->r = merge(at(a)->r, b);
        return a;
    }
    at(b)->l = merge(a, at(b)->l);
    return b;
}

static void tree_add(uint32_t i)
{
    uint32_t lo, hi;
    at(i)->l = at(i)->r = 0;
    split(root, at(i)->data, at(i)->key, &lo, &hi);
    root = merge(merge(lo, i), hi);
}

static void tree_remove(uint32_t i)
{
    uint32_t *link = &root;
    while (*link && *link != i)
        link = before(at(*link), at(i)->data, at(i)->key) ? &at(*link)->r : &at(*link)->l;
    if (*link)
        *link = merge(at(i)->l, at(i)->r);
}

/* a new entry waits; when PEND wait, one of them (round robin) goes into
 * the treap to make room */
static void pend_add(uint32_t i)
{
    if (npend == PEND) {
        unsigned k = evict++ % PEND;
        at(pend[k])->pend = 0;
        tree_add(pend[k]);
        pend[k] = i;
        at(i)->pend = k + 1;
        return;
    }
    pend[npend++] = i;
    at(i)->pend = npend;
}

static void pend_remove(uint32_t i)
{
    unsigned k = at(i)->pend - 1, last = pend[--npend];
    pend[k] = last;
    at(last)->pend = k + 1;
    at(i)->pend = 0;
}

static size_t put(uint64_t key, uint64_t *keys, size_t n, size_t max);

/* the keys of entries in t whose start lies in [lo, hi) */
static size_t tree_range(uint32_t t, uint64_t lo, uint64_t hi, uint64_t *keys, size_t n,
                         size_t max)
{
    while (t && n < max) {
        const entry *e = at(t);
        if (e->data < lo) {
            t = e->r;
        } else if (e->data >= hi) {
            t = e->l;
        } else {
            n = tree_range(e->l, lo, hi, keys, n, max);
            n = put(e->key, keys, n, max);
            t = e->r;
        }
    }
    return n;
}

void cs_di_add(uint64_t data, uint64_t key)
{
    unsigned b = bucket_of(data >> GRAIN);
    cs_spin_lock(&mu);
    for (uint32_t i = head[b]; i; i = at(i)->next)
        if (at(i)->data == data && at(i)->key == key) {
            at(i)->n++;
            cs_spin_unlock(&mu);
            return;
        }
    uint32_t i = entry_new();
    if (i) { /* out of entries: that tensor's data goes unwatched */
        *at(i) = (entry){.data = data, .key = key, .n = 1, .next = head[b]};
        head[b] = i;
        pend_add(i);
        if (data < atomic_load_explicit(&cs_di_lo, memory_order_relaxed))
            atomic_store_explicit(&cs_di_lo, data, memory_order_relaxed);
        if (data > atomic_load_explicit(&cs_di_hi, memory_order_relaxed))
            atomic_store_explicit(&cs_di_hi, data, memory_order_relaxed);
    }
    cs_spin_unlock(&mu);
}

void cs_di_remove(uint64_t data, uint64_t key)
{
    unsigned b = bucket_of(data >> GRAIN);
    cs_spin_lock(&mu);
    for (uint32_t *link = &head[b], i; (i = *link); link = &at(i)->next) {
        entry *e = at(i);
        if (e->data != data || e->key != key)
            continue;
        if (--e->n == 0) {
            if (e->pend)
                pend_remove(i);
            else
                tree_remove(i);
            *link = e->next;
            e->key = e->data = 0; /* no stale key for anyone to find */
            e->next = free_list;
            free_list = i;
            if (!root && !npend) { /* nothing indexed: no hull */
                atomic_store_explicit(&cs_di_lo, UINT64_MAX, memory_order_relaxed);
                atomic_store_explicit(&cs_di_hi, 0, memory_order_relaxed);
            }
        }
        break;
    }
    cs_spin_unlock(&mu);
}

static size_t put(uint64_t key, uint64_t *keys, size_t n, size_t max)
{
    for (size_t k = 0; k < n; k++)
        if (keys[k] == key)
            return n;
    if (n < max)
        keys[n++] = key;
    return n;
}

size_t cs_di_starts_in(uint64_t lo, uint64_t hi, uint64_t *keys, size_t max)
{
    size_t n = 0;
    if (hi <= lo)
        return 0;
    uint64_t g0 = lo >> GRAIN, g1 = (hi - 1) >> GRAIN;
    cs_spin_lock(&mu);
    if (g1 - g0 < MAX_GRANULES) {
        /* each granule's own bucket, taking only that granule's entries
         * (two granules of the range may share a bucket) */
        for (uint64_t g = g0; g <= g1; g++)
            for (uint32_t i = head[bucket_of(g)]; i; i = at(i)->next) {
                const entry *e = at(i);
                if (e->data >> GRAIN == g && e->data >= lo && e->data < hi)
                    n = put(e->key, keys, n, max);
            }
    } else {
        n = tree_range(root, lo, hi, keys, n, max);
        for (unsigned k = 0; k < npend && n < max; k++)
            if (at(pend[k])->data >= lo && at(pend[k])->data < hi)
                n = put(at(pend[k])->key, keys, n, max);
    }
    cs_spin_unlock(&mu);
    return n;
}

void cs_di_own_memory(void (*fn)(void *ud, const void *p, size_t n), void *ud)
{
    for (unsigned c = 0; c < NCHUNKS && chunks[c]; c++)
        fn(ud, chunks[c], sizeof(entry) << CHUNK_BITS);
}

void cs_di_fork_lock(int lock)
{
    if (lock)
        cs_spin_lock(&mu);
    else
        cs_spin_unlock(&mu);
}
