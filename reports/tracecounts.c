/* The COUNTS series the HTML plot draws: records merged into at most
 * CS_COUNTS_MAX points (a point keeps its last time and each series'
 * peak), sorted by time at the end; and how many events the process
 * observed, which END and COUNTS records tell. */
#include "reader_int.h"
#include "util.h"

#include <stdlib.h>

static void counts_merge(cs_rec_counts *into, const cs_rec_counts *c)
{
    /* the later time, the peak of each series: a plot must not hide a peak */
#define MAXF(f) if (c->f > into->f) into->f = c->f
    MAXF(time_ns);
    MAXF(events);
    MAXF(live_dlpack);
    MAXF(live_dlpack_bytes);
    MAXF(live_numpy);
    MAXF(live_numpy_bytes);
#undef MAXF
}

static void counts_push(cs_trace *t, const cs_rec_counts *c)
{
    struct cs_trace_priv *p = t->priv;
    if (t->ncounts == CS_COUNTS_MAX) {
        /* halve: merge neighbours, double the records per point */
        size_t k = 0;
        for (size_t i = 0; i + 1 < t->ncounts; i += 2) {
            cs_rec_counts m = t->counts[i];
            counts_merge(&m, &t->counts[i + 1]);
            t->counts[k++] = m;
        }
        t->ncounts = k;
        t->counts_stride *= 2;
    }
    if (t->ncounts == p->counts_cap) {
        p->counts_cap = p->counts_cap ? p->counts_cap * 2 : 64;
        if (p->counts_cap > CS_COUNTS_MAX)
            p->counts_cap = CS_COUNTS_MAX;
        t->counts = cs_xrealloc(t->counts, p->counts_cap * sizeof *t->counts);
    }
    t->counts[t->ncounts++] = *c;
}

void trace_counts_add(cs_trace *t, const cs_rec_counts *c)
{
    struct cs_trace_priv *p = t->priv;
    t->counts_records++;
    if (c->events > t->counts_events)
        t->counts_events = c->events;
    if (!t->counts_stride)
        t->counts_stride = 1;
    if (p->bucket_n == 0)
        p->bucket = *c;
    else
        counts_merge(&p->bucket, c);
    if (++p->bucket_n >= t->counts_stride) {
        counts_push(t, &p->bucket);
        p->bucket_n = 0;
    }
}

static int counts_cmp(const void *a, const void *b)
{
    const cs_rec_counts *x = a, *y = b;
    return x->time_ns < y->time_ns ? -1 : x->time_ns > y->time_ns;
}

void trace_counts_finish(cs_trace *t)
{
    struct cs_trace_priv *p = t->priv;
    if (p->bucket_n) {
        counts_push(t, &p->bucket);
        p->bucket_n = 0;
    }
    /* threads commit their records independently: put them in time order */
    if (t->ncounts > 1)
        qsort(t->counts, t->ncounts, sizeof *t->counts, counts_cmp);
}

uint64_t cs_trace_events_observed(const cs_trace *t)
{
    uint64_t n = t->nevents;
    if (t->has_end && t->end.events > n)
        n = t->end.events;
    if (t->counts_events > n)
        n = t->counts_events;
    return n;
}
