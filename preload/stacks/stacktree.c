/* Stacks interned (stack.h): each stack a path in a prefix tree of frames,
 * its leaf's id all an event stores. A new node is written to the trace
 * (CS_REC_FRAME, a Python frame's code first) and again to a forked
 * child's file when first used there. A thread's exact cache of whole
 * stacks spares most lookups the tree's mutex. */
#include "stack_int.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "tracefile.h"
#include "alloc.h"

typedef struct node {
    uint32_t parent;
    _Atomic uint32_t gen;
    uint64_t value;
} node;

#define NCHUNK 65536
static node *_Atomic node_tab[4096];
static uint32_t node_count; /* ids 1..node_count; 0 is the empty stack */
static uint32_t *map_ids;   /* open addressing over (parent, value) */
static size_t map_cap;
static pthread_mutex_t tree_mu = PTHREAD_MUTEX_INITIALIZER;

static node *node_at(uint32_t id)
{
    node *c = atomic_load_explicit(&node_tab[id / NCHUNK], memory_order_acquire);
    return c ? &c[id % NCHUNK] : NULL;
}

static void node_emit(uint32_t id)
{
    node *nd = node_at(id);
    if (!nd)
        return;
    atomic_store(&nd->gen, cs_trace_gen());
    if (CS_FRAME_IS_PY(nd->value))
        code_write(CS_FRAME_PY_CODE(nd->value));
    cs_rec_frame r = {.id = id, .parent = nd->parent, .value = nd->value};
    cs_trace_write(CS_REC_FRAME, &r, sizeof r);
}

/* tree_mu held */
static uint32_t node_get(uint32_t parent, uint64_t value)
{
    if ((node_count + 1) * 2 > map_cap) {
        size_t ncap = map_cap ? map_cap * 2 : 4096;
        uint32_t *nm = cs_calloc(ncap, sizeof *nm);
        if (!nm)
            return 0;
        for (size_t j = 0; j < map_cap; j++) {
            uint32_t id = map_ids[j];
            if (!id)
                continue;
            node *nd = node_at(id);
            size_t i = hmix(nd->parent, nd->value) & (ncap - 1);
            while (nm[i])
                i = (i + 1) & (ncap - 1);
            nm[i] = id;
        }
        cs_free(map_ids);
        map_ids = nm;
        map_cap = ncap;
    }
    size_t m = map_cap - 1, i;
    for (i = hmix(parent, value) & m; map_ids[i]; i = (i + 1) & m) {
        node *nd = node_at(map_ids[i]);
        if (nd->parent == parent && nd->value == value)
            return map_ids[i];
    }
    uint32_t id = node_count + 1;
    if (id / NCHUNK >= 4096)
        return 0;
    if (!atomic_load(&node_tab[id / NCHUNK])) {
        node *chunk = cs_calloc(NCHUNK, sizeof *chunk);
        if (!chunk)
            return 0;
        atomic_store(&node_tab[id / NCHUNK], chunk);
    }
    node *nd = node_at(id);
    nd->parent = parent;
    nd->value = value;
    node_count = id;
    map_ids[i] = id;
    node_emit(id);
    return id;
}

static uint32_t tree_insert(const uint64_t *vals, int n)
{
    uint32_t parent = 0;
    pthread_mutex_lock(&tree_mu);
    /* outermost first, so stacks share their roots */
    for (int i = n - 1; i >= 0 && (i == n - 1 || parent); i--)
        parent = node_get(parent, vals[i]);
    pthread_mutex_unlock(&tree_mu);
    /* nodes made before a fork are in the parent's trace only: the
     * child's gets them when first used there */
    cs_stack_ensure(parent);
    return parent;
}

void cs_stack_ensure(uint32_t id)
{
    node *nd;
    if (!id || !(nd = node_at(id)) || atomic_load(&nd->gen) == cs_trace_gen())
        return;
    uint32_t chain[MAXF * 2];
    int n = 0;
    pthread_mutex_lock(&tree_mu);
    for (uint32_t x = id; x && n < (int)(sizeof chain / sizeof chain[0]); x = node_at(x)->parent) {
        if (atomic_load(&node_at(x)->gen) == cs_trace_gen())
            break;
        chain[n++] = x;
    }
    while (n > 0)
        node_emit(chain[--n]);
    pthread_mutex_unlock(&tree_mu);
}

int cs_stack_raw(uint32_t id, uint64_t *vals, int max)
{
    int n = 0;
    for (uint32_t x = id; x && n < max; x = node_at(x)->parent)
        vals[n++] = node_at(x)->value;
    return n;
}

/* The interned id of a whole stack: the thread's exact cache, else the
 * tree. */
uint32_t stack_id(cs_thread *t, const uint64_t *vals, int n, int importing)
{
    /* one multiply a frame, one full mix at the end: only picks a set, the
     * match itself is exact */
    uint64_t h = 0x12345;
    for (int i = 0; i < n; i++)
        h = (h ^ vals[i]) * 0x100000001b3ull;
    h = hmix(h, (uint64_t)n);
    if (n <= CMAXF) {
        unsigned set = (unsigned)(h % CSETS);
        for (int w = 0; w < CWAYS; w++) {
            centry *e = &t->cache->e[set][w];
            if (e->hash == h && e->n == (uint32_t)n &&
                memcmp(e->vals, vals, (size_t)n * sizeof vals[0]) == 0) {
                cs_stack_ensure(e->id);
                t->importing = e->importing;
                return e->id;
            }
        }
        uint32_t id = tree_insert(vals, n);
        centry *e = &t->cache->e[set][t->cache->victim[set]];
        t->cache->victim[set] = (uint8_t)((t->cache->victim[set] + 1) % CWAYS);
        e->hash = h;
        e->n = (uint32_t)n;
        e->id = id;
        e->importing = importing;
        memcpy(e->vals, vals, (size_t)n * sizeof vals[0]);
        return id;
    }
    return tree_insert(vals, n);
}

void cs_stack_fork_lock(int lock)
{
    if (lock)
        pthread_mutex_lock(&tree_mu);
    else
        pthread_mutex_unlock(&tree_mu);
}
