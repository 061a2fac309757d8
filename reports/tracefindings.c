/* The replay's findings: each event judged by the reader's lifecycle, and
 * what it reports kept in order, the first FMEM_MAX in memory and the rest
 * in an unlinked temporary file, so that a trace of nothing but findings
 * keeps memory flat; cs_trace_replay() hands them out. */
#include "reader_int.h"
#include "util.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

/* -D for the fuzz build (Makefile), to reach the spill with small inputs */
#ifndef FMEM_MAX
#define FMEM_MAX 4096
#endif

void trace_store_finding(void *ud, const cs_finding *f)
{
    cs_trace *t = ud;
    struct cs_trace_priv *p = t->priv;
    t->nfindings++;
    if (p->fmem_n < FMEM_MAX) {
        if (p->fmem_n == p->fmem_cap) {
            p->fmem_cap = p->fmem_cap ? p->fmem_cap * 2 : 16;
            p->fmem = cs_xrealloc(p->fmem, p->fmem_cap * sizeof *p->fmem);
        }
        p->fmem[p->fmem_n++] = *f;
        return;
    }
    /* a pathological trace (every event a finding): keep memory flat */
    if (!p->spill && !p->spill_failed && !(p->spill = tmpfile()))
        p->spill_failed = 1;
    if (p->spill && fwrite(f, sizeof *f, 1, p->spill) == 1) {
        p->spill_n++;
    } else if (!p->spill_failed) {
        p->spill_failed = 1;
        fprintf(stderr, "capsan: %s: cannot keep more than %d findings (temporary file: %s); "
                "the rest are counted, not shown\n", t->path, FMEM_MAX, strerror(errno));
    }
}

void trace_findings_clear(cs_trace *t)
{
    struct cs_trace_priv *p = t->priv;
    p->fmem_n = 0;
    if (p->spill)
        fclose(p->spill);
    p->spill = NULL;
    p->spill_n = 0;
    t->nfindings = 0;
}

/* Judge one event. A call that protect=1 skipped is marked so in the
 * findings it just made, as the runtime marks its live report: the trace
 * holds the event as it was before the verdict. */
void trace_judge(cs_trace *t, const cs_event *ev)
{
    struct cs_trace_priv *p = t->priv;
    size_t before = p->fmem_n;
    unsigned v = cs_lc_event(p->lc, ev);
    p->judged++;
    if (!(v & CS_VERDICT_SKIP) || !p->protect || p->fmem_n == before)
        return;
    for (size_t i = before; i < p->fmem_n; i++)
        for (unsigned j = 0; j < p->fmem[i].nevents && j < CS_FINDING_MAX_EVENTS; j++) {
            cs_event *e = &p->fmem[i].events[j];
            if (e->kind == ev->kind && e->time_ns == ev->time_ns && e->thread == ev->thread &&
                e->obj == ev->obj)
                e->flags |= CS_EVF_SKIPPED;
        }
}

uint64_t cs_trace_replay(cs_trace *t, cs_finding_cb cb, void *ud)
{
    struct cs_trace_priv *p = t->priv;
    for (size_t i = 0; i < p->fmem_n; i++)
        cb(ud, &p->fmem[i]);
    if (p->spill && p->spill_n) {
        cs_finding f;
        fflush(p->spill);
        rewind(p->spill);
        for (uint64_t i = 0; i < p->spill_n && fread(&f, sizeof f, 1, p->spill) == 1; i++)
            cb(ud, &f);
        fseek(p->spill, 0, SEEK_END);
    }
    return t->nevents;
}
