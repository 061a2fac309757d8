/* dlpack-data-freed (see dataguard.h).
 *
 * Consumed tensors are kept in a small table keyed by the struct, with the
 * span of their data; a counting filter of the pages those spans cover
 * makes a free() that touches none of them cost one load. A hit looks the
 * freed block up against every consumed tensor (a free of the block the
 * data starts in, or lies inside), and asks the lifecycle whether that
 * tensor is still consumed and undeleted. A tensor's own deleter frees its
 * data after the tensor was released, so those frees never match. */
#include "dataguard.h"

#include <dlfcn.h>
#include <malloc.h>
#include <stdlib.h>
#include <string.h>

#include "lifecycle.h"
#include "runtime.h"
#include "spin.h"

_Atomic uint16_t cs_dg_pages[4096];

typedef struct guarded {
    void *mt; /* NULL: empty */
    uintptr_t data;
    uint64_t n;
} guarded;

static cs_spin mu = CS_SPIN_INIT;
static guarded *tab;
static size_t cap, used;
/* this thread holds mu: a free() made meanwhile (the table growing) is
 * capsan's own */
static __thread int holding __attribute__((tls_model("initial-exec")));

#define MAX_PAGES 64 /* pages counted per tensor: its first ones and its last */

static void count_pages(uintptr_t data, uint64_t n, int add)
{
    uintptr_t first = data >> 12, last = (data + (n ? n - 1 : 0)) >> 12;
    for (uintptr_t pg = first; pg <= last; pg++) {
        if (pg - first == MAX_PAGES)
            pg = last; /* a free inside the rest of a huge span is still found
                        * when it frees the block the data starts in */
        _Atomic uint16_t *c = &cs_dg_pages[cs_dg_page(pg << 12)];
        uint16_t v = atomic_load_explicit(c, memory_order_relaxed);
        /* saturating: a count that hit its top stays (only more lookups) */
        if (add ? v != UINT16_MAX : v != 0 && v != UINT16_MAX)
            atomic_store_explicit(c, (uint16_t)(add ? v + 1 : v - 1), memory_order_relaxed);
    }
}

static size_t slot_of(const void *mt)
{
    size_t m = cap - 1, i = (((uintptr_t)mt >> 4) * 0x9e3779b97f4a7c15ull >> 20) & m;
    while (tab[i].mt && tab[i].mt != mt)
        i = (i + 1) & m;
    return i;
}

/* mu held; the old table comes back to be freed once mu is let go */
static guarded *grow(void)
{
    size_t ncap = cap ? cap * 2 : 64;
    guarded *nt = calloc(ncap, sizeof *nt), *old = tab;
    if (!nt)
        return NULL;
    size_t ocap = cap;
    tab = nt;
    cap = ncap;
    for (size_t j = 0; j < ocap; j++)
        if (old[j].mt)
            tab[slot_of(old[j].mt)] = old[j];
    return old;
}

void cs_dg_consumed(void *mt, uintptr_t data, uint64_t n)
{
    if (!mt || !data)
        return;
    guarded *old = NULL;
    cs_spin_lock(&mu);
    holding = 1;
    if ((used + 1) * 2 > cap)
        old = grow();
    if (cap) {
        size_t i = slot_of(mt);
        if (tab[i].mt)
            count_pages(tab[i].data, tab[i].n, 0); /* the same struct lent again */
        else
            used++;
        tab[i] = (guarded){mt, data, n};
        count_pages(data, n, 1);
    }
    holding = 0;
    cs_spin_unlock(&mu);
    free(old);
}

void cs_dg_released(void *mt)
{
    if (!__atomic_load_n(&used, __ATOMIC_RELAXED))
        return; /* no tensor is guarded (the usual case: nothing to find) */
    cs_spin_lock(&mu);
    if (cap) {
        size_t m = cap - 1, i = slot_of(mt);
        if (tab[i].mt) {
            count_pages(tab[i].data, tab[i].n, 0);
            /* backward-shift delete */
            for (size_t j = (i + 1) & m; tab[j].mt; j = (j + 1) & m) {
                size_t home = (((uintptr_t)tab[j].mt >> 4) * 0x9e3779b97f4a7c15ull >> 20) & m;
                if (((j - home) & m) >= ((j - i) & m)) {
                    tab[i] = tab[j];
                    i = j;
                }
            }
            tab[i].mt = NULL;
            used--;
        }
    }
    cs_spin_unlock(&mu);
}

void cs_dg_check_slow(uintptr_t p, unsigned how)
{
    if (!p || holding || !cs_recording || !cs_lc)
        return;
    /* the block being freed: all of it for malloc's, p itself otherwise */
    size_t span = how == CS_FREED_LIBC ? malloc_usable_size((void *)p) : 1;
    if (!span)
        span = 1;
    void *hit[8];
    int nh = 0;
    cs_spin_lock(&mu);
    for (size_t i = 0; i < cap && nh < 8; i++) {
        const guarded *g = &tab[i];
        if (g->mt && g->data < p + span && p < g->data + (g->n ? g->n : 1))
            hit[nh++] = g->mt;
    }
    cs_spin_unlock(&mu);
    for (int k = 0; k < nh; k++) {
        uint64_t mt = (uint64_t)(uintptr_t)hit[k];
        cs_lc_lock(cs_lc, mt);
        int st = cs_lc_state(cs_lc, CS_NS_DLPACK, mt);
        cs_lc_unlock(cs_lc, mt);
        if (st != CS_ST_CONSUMED) {
            cs_dg_released(hit[k]); /* released on a path that did not say so */
            continue;
        }
        cs_event ev = {.kind = CS_EV_DATA_FREED, .obj = mt, .a = p, .aux = (uint16_t)how};
        cs_emit(&ev, 1, NULL, NULL); /* reported before the memory is reused */
    }
}

/* ---- PyMem_Free: a producer's buffers made with PyMem_Malloc ---- */
static void (*real_pymem_free)(void *);

static void hook_pymem_free(void *p)
{
    cs_dg_check((uintptr_t)p, CS_FREED_PYMEM);
    if (!real_pymem_free)
        *(void **)&real_pymem_free = dlsym(RTLD_DEFAULT, "PyMem_Free");
    real_pymem_free(p);
}

const cs_hook cs_dg_hooks[] = {
    {"PyMem_Free", (void *)hook_pymem_free, NULL},
};
const int cs_dg_nhooks = sizeof cs_dg_hooks / sizeof cs_dg_hooks[0];
