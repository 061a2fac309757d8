/* Leak groups (see leakgroups.h): an open-addressing table keyed by
 * (kind, first event kind, first event stack as printed). */
#include "leakgroups.h"

#include <stdlib.h>
#include <string.h>

#include "hash.h"
#include "alloc.h"
#include "sort.h"

static uint64_t key_of(const cs_finding *f, uint64_t where)
{
    const cs_event *e = f->nevents ? &f->events[0] : NULL;
    return cs_hash64(((uint64_t)f->kind << 40) ^ ((uint64_t)(e ? e->kind : 0) << 32) ^ where);
}

static int same(const cs_leak_group *g, const cs_finding *f, uint64_t where)
{
    const cs_event *e = f->nevents ? &f->events[0] : NULL;
    return g->kind == f->kind && g->evkind == (e ? e->kind : 0) && g->where == where;
}

static int grow(cs_leak_groups *g)
{
    size_t ncap = g->cap ? g->cap * 2 : 64;
    cs_leak_group *n = cs_calloc(ncap, sizeof *n);
    if (!n)
        return -1;
    for (size_t i = 0; i < g->cap; i++) {
        if (!g->tab[i].used)
            continue;
        size_t j = key_of(&g->tab[i].first, g->tab[i].where) & (ncap - 1);
        while (n[j].used)
            j = (j + 1) & (ncap - 1);
        n[j] = g->tab[i];
    }
    cs_free(g->tab);
    g->tab = n;
    g->cap = ncap;
    return 0;
}

int cs_lg_add(cs_leak_groups *g, const cs_finding *f, uint64_t where)
{
    if ((g->n + 1) * 2 > g->cap && grow(g) != 0)
        return -1;
    size_t j = key_of(f, where) & (g->cap - 1);
    while (g->tab[j].used && !same(&g->tab[j], f, where))
        j = (j + 1) & (g->cap - 1);
    cs_leak_group *x = &g->tab[j];
    if (!x->used) {
        x->used = 1;
        x->kind = f->kind;
        x->evkind = f->nevents ? f->events[0].kind : 0;
        x->where = where;
        x->seq = g->n++;
        x->first = *f;
    } else if (f->nevents && x->first.nevents &&
               f->events[0].time_ns < x->first.events[0].time_ns) {
        x->first = *f; /* the example is the oldest of them */
    }
    x->count++;
    x->bytes += f->bytes;
    x->ind_count += f->nindirect;
    x->ind_bytes += f->indirect_bytes;
    return 0;
}

static int cmp(const void *a, const void *b)
{
    const cs_leak_group *x = *(const cs_leak_group *const *)a, *y = *(const cs_leak_group *const *)b;
    /* errors first: a max_findings budget that warnings (live at _exit)
     * filled would hide the error the exit status is about */
    int ex = cs_finding_severity(&x->first) == CS_SEV_ERROR,
        ey = cs_finding_severity(&y->first) == CS_SEV_ERROR;
    if (ex != ey)
        return ex ? -1 : 1;
    if (x->bytes != y->bytes)
        return x->bytes > y->bytes ? -1 : 1;
    if (x->count != y->count)
        return x->count > y->count ? -1 : 1;
    return x->seq < y->seq ? -1 : x->seq > y->seq;
}

size_t cs_lg_sorted(const cs_leak_groups *g, const cs_leak_group ***out)
{
    *out = NULL;
    if (!g->n)
        return 0;
    const cs_leak_group **v = cs_calloc(g->n, sizeof *v);
    if (!v)
        return 0;
    size_t n = 0;
    for (size_t i = 0; i < g->cap; i++)
        if (g->tab[i].used)
            v[n++] = &g->tab[i];
    cs_sort(v, n, sizeof *v, cmp);
    *out = v;
    return n;
}

void cs_lg_clear(cs_leak_groups *g)
{
    if (g->tab)
        memset(g->tab, 0, g->cap * sizeof *g->tab);
    g->n = 0;
}

void cs_lg_free(cs_leak_groups *g)
{
    cs_free(g->tab);
    g->tab = NULL;
    g->cap = g->n = 0;
}
