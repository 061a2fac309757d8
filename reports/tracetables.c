/* The trace's stack tree (FRAME records) and code objects (CODE records),
 * open-addressing tables keyed by id, and the lookups the report makes:
 * code object, thread, module of an address, a stack's frame values, the
 * process's facts. A repeated id replaces the earlier record. */
#include "reader_int.h"
#include "util.h"

#include <stdlib.h>
#include <string.h>

void trace_frames_put(struct cs_trace_priv *p, uint32_t id, uint32_t parent, uint64_t value)
{
    if ((p->frames_n + 1) * 2 > p->frames_cap) {
        size_t ncap = p->frames_cap ? p->frames_cap * 2 : 1024;
        frame_slot *n = cs_xrealloc(NULL, ncap * sizeof *n);
        memset(n, 0, ncap * sizeof *n);
        for (size_t i = 0; i < p->frames_cap; i++) {
            if (!p->frames[i].id)
                continue;
            size_t j = cs_hash32(p->frames[i].id) & (ncap - 1);
            while (n[j].id)
                j = (j + 1) & (ncap - 1);
            n[j] = p->frames[i];
        }
        free(p->frames);
        p->frames = n;
        p->frames_cap = ncap;
    }
    size_t j = cs_hash32(id) & (p->frames_cap - 1);
    while (p->frames[j].id && p->frames[j].id != id)
        j = (j + 1) & (p->frames_cap - 1);
    if (!p->frames[j].id)
        p->frames_n++;
    p->frames[j].id = id;          /* a repeated id: the later record wins */
    p->frames[j].parent = parent;
    p->frames[j].value = value;
}

static const frame_slot *frames_get(const struct cs_trace_priv *p, uint32_t id)
{
    if (!id || !p->frames_cap)
        return NULL;
    size_t j = cs_hash32(id) & (p->frames_cap - 1);
    while (p->frames[j].id) {
        if (p->frames[j].id == id)
            return &p->frames[j];
        j = (j + 1) & (p->frames_cap - 1);
    }
    return NULL;
}

static code_slot *code_find_slot(code_slot *tab, size_t cap, uint32_t id)
{
    size_t j = cs_hash32(id) & (cap - 1);
    while (tab[j].index_plus1 && tab[j].id != id)
        j = (j + 1) & (cap - 1);
    return &tab[j];
}

void trace_codes_put(struct cs_trace_priv *p, uint32_t id, uint32_t firstlineno,
                     const char *file, size_t flen, const char *name, size_t nlen)
{
    if ((p->ncodes + 1) * 2 > p->code_index_cap) {
        size_t ncap = p->code_index_cap ? p->code_index_cap * 2 : 256;
        code_slot *n = cs_xrealloc(NULL, ncap * sizeof *n);
        memset(n, 0, ncap * sizeof *n);
        for (size_t i = 0; i < p->code_index_cap; i++)
            if (p->code_index[i].index_plus1)
                *code_find_slot(n, ncap, p->code_index[i].id) = p->code_index[i];
        free(p->code_index);
        p->code_index = n;
        p->code_index_cap = ncap;
    }
    code_slot *s = code_find_slot(p->code_index, p->code_index_cap, id);
    cs_code_rec *c;
    if (s->index_plus1) {          /* redefined: replace in place */
        c = &p->codes[s->index_plus1 - 1];
        free(c->file);
        free(c->name);
    } else {
        if (p->ncodes == p->codes_cap) {
            p->codes_cap = p->codes_cap ? p->codes_cap * 2 : 256;
            p->codes = cs_xrealloc(p->codes, p->codes_cap * sizeof *p->codes);
        }
        c = &p->codes[p->ncodes++];
        s->id = id;
        s->index_plus1 = (uint32_t)p->ncodes;
    }
    c->id = id;
    c->firstlineno = firstlineno;
    c->file = cs_xstrndup(file, flen);
    c->name = cs_xstrndup(name, nlen);
}

const cs_code_rec *cs_trace_code(const cs_trace *t, uint32_t code_id)
{
    const struct cs_trace_priv *p = t->priv;
    if (!p->code_index_cap)
        return NULL;
    code_slot *s = code_find_slot(p->code_index, p->code_index_cap, code_id);
    return s->index_plus1 ? &p->codes[s->index_plus1 - 1] : NULL;
}

const cs_thread_rec *cs_trace_thread(const cs_trace *t, uint32_t thread)
{
    for (size_t i = t->nthreads; i-- > 0;)
        if (t->threads[i].thread == thread)
            return &t->threads[i];
    return NULL;
}

const cs_module_rec *cs_trace_module(const cs_trace *t, uint64_t ip)
{
    for (size_t i = t->nmodules; i-- > 0;)
        if (ip >= t->modules[i].lo && ip < t->modules[i].hi)
            return &t->modules[i];
    return NULL;
}

int cs_trace_stack(const cs_trace *t, uint32_t stack, uint64_t *values, int max)
{
    int n = 0;
    /* max also bounds a parent cycle in a corrupt tree */
    while (stack && n < max) {
        const frame_slot *s = frames_get(t->priv, stack);
        if (!s)
            break;
        values[n++] = s->value;
        stack = s->parent;
    }
    return n;
}

void cs_trace_proc_info(const cs_trace *t, cs_proc_info *out)
{
    memset(out, 0, sizeof *out);
    out->pid = t->hdr.pid;
    out->ppid = t->hdr.ppid;
    out->ended = t->has_end ? (int)t->end.how : CS_END_UNKNOWN;
    out->status = t->has_end ? t->end.status : 0;
    out->start_mono_ns = t->hdr.start_mono_ns;
}
