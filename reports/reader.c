/* Trace file reader: see reader.h for the one-pass design and
 * reports/FORMAT.md for the format. Every length and offset read from the
 * file is checked before use; the first record that does not fit stops the
 * scan with a message naming its offset, and everything before it stays
 * usable (a report from a damaged trace beats no report). */
#include "reader.h"
#include "util.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

/* Drop pages behind the cursor every so often: the mapping is clean and
 * file-backed, so this only keeps the resident size flat on huge traces. */
#define CS_RELEASE_CHUNK (16u << 20)

typedef struct frame_slot {
    uint32_t id;              /* 0 = empty slot (node 0 is never stored) */
    uint32_t parent;
    uint64_t value;
} frame_slot;

typedef struct code_slot {
    uint32_t id;
    uint32_t index_plus1;     /* 0 = empty slot */
} code_slot;

struct cs_trace_priv {
    const uint8_t *map;
    size_t size;
    frame_slot *frames;       /* open addressing, power-of-two capacity */
    size_t frames_cap, frames_n;
    cs_code_rec *codes;
    size_t ncodes, codes_cap;
    code_slot *code_index;
    size_t code_index_cap;
    size_t modules_cap, threads_cap;

    /* the replay */
    cs_lifecycle *lc;
    int protect;              /* what the lifecycle judges with */
    int rereplay;             /* OPTIONS changed protect after events were judged */
    uint64_t judged;          /* events given to lc */
    /* findings: the first FMEM_MAX in memory, the rest in an unlinked file */
    cs_finding *fmem;
    size_t fmem_n, fmem_cap;
    FILE *spill;
    uint64_t spill_n;
    int spill_failed;
    /* LIVE: the crash-safe live state, filled slots only */
    cs_live_slot *live;
    size_t nlive, live_cap;
    /* COUNTS: the bucket being filled while downsampling */
    cs_rec_counts bucket;
    uint64_t bucket_n;
    size_t counts_cap;
};

#ifndef FMEM_MAX
#define FMEM_MAX 4096
#endif

/* ---- small helpers --------------------------------------------------- */

/* A NUL-terminated string at p within avail bytes: its length, or -1. */
static long bounded_strlen(const uint8_t *p, size_t avail)
{
    const uint8_t *z = memchr(p, 0, avail);
    return z ? (long)(z - p) : -1;
}

static const char *rec_type_name(unsigned type)
{
    switch (type) {
    case CS_REC_PAD: return "PAD";
    case CS_REC_PROCESS: return "PROCESS";
    case CS_REC_MODULE: return "MODULE";
    case CS_REC_CODE: return "CODE";
    case CS_REC_FRAME: return "FRAME";
    case CS_REC_EVENT: return "EVENT";
    case CS_REC_THREAD: return "THREAD";
    case CS_REC_END: return "END";
    case CS_REC_OPTIONS: return "OPTIONS";
    case CS_REC_COUNTS: return "COUNTS";
    case CS_REC_LIVE: return "LIVE";
    default: return "unknown";
    }
}

static void corrupt(cs_trace *t, uint64_t off, const char *why)
{
    t->error = 1;
    t->data_end = off;
    snprintf(t->errmsg, sizeof t->errmsg,
             "%s: corrupt record at offset 0x%llx (%s); the rest of the file is ignored",
             t->path, (unsigned long long)off, why);
}

/* ---- tables ---------------------------------------------------------- */

static void frames_put(struct cs_trace_priv *p, uint32_t id, uint32_t parent, uint64_t value)
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

static void codes_put(struct cs_trace_priv *p, uint32_t id, uint32_t firstlineno,
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

/* ---- findings of the replay ------------------------------------------ */

static void store_finding(void *ud, const cs_finding *f)
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

static void findings_clear(cs_trace *t)
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
static void judge(cs_trace *t, const cs_event *ev)
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

/* ---- COUNTS ------------------------------------------------------------ */

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

static void counts_add(cs_trace *t, const cs_rec_counts *c)
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

static void counts_finish(cs_trace *t)
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

/* ---- OPTIONS ------------------------------------------------------------- */

/* The value of key in a k=v:k=v string (the last setting wins), or NULL. */
static const char *option_value(const char *opts, const char *key, size_t *len)
{
    const char *found = NULL;
    size_t kl = strlen(key);
    for (const char *o = opts; o && *o;) {
        size_t n = strcspn(o, ":");
        if (n > kl && !strncmp(o, key, kl) && o[kl] == '=') {
            found = o + kl + 1;
            *len = n - kl - 1;
        }
        o += n;
        if (*o)
            o++;
    }
    return found;
}

static void apply_options(cs_trace *t)
{
    struct cs_trace_priv *p = t->priv;
    size_t n = 0;
    const char *v = option_value(t->options, "protect", &n);
    int protect = v && ((n == 1 && *v == '1') || (n == 4 && !strncmp(v, "true", 4)) ||
                        (n == 3 && !strncmp(v, "yes", 3)));
    if (protect != p->protect) {
        /* the runtime's protect decides whether skipped calls changed
         * state: replay must judge as the runtime did */
        p->protect = protect;
        if (p->lc)
            cs_lc_set_protect(p->lc, protect);
        if (p->judged)
            p->rereplay = 1;
    }
    free(t->opt_suppressions);
    t->opt_suppressions = NULL;
    if ((v = option_value(t->options, "suppressions", &n)) && n)
        t->opt_suppressions = cs_xstrndup(v, n);
    t->opt_max_findings = -1;
    if ((v = option_value(t->options, "max_findings", &n)) && n && n < 20) {
        char buf[24];
        memcpy(buf, v, n);
        buf[n] = 0;
        char *end;
        long x = strtol(buf, &end, 0);
        if (!*end && x >= 0)
            t->opt_max_findings = x;
    }
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

/* ---- record parsing (pass 1) ----------------------------------------- */

/* Each parser gets the payload after the cs_rec header; returns NULL when
 * the record is fine or a reason for corrupt(). */

static const char *parse_process(cs_trace *t, const uint8_t *p, size_t n)
{
    cs_rec_process h;
    if (n < sizeof h)
        return "PROCESS record too short";
    memcpy(&h, p, sizeof h);
    p += sizeof h;
    n -= sizeof h;
    if (h.argc > n)                 /* each string takes at least its NUL */
        return "PROCESS argc larger than the record";
    char **argv = cs_xrealloc(NULL, ((size_t)h.argc + 1) * sizeof *argv);
    size_t k = 0;
    const char *why = NULL;
    for (; k < h.argc; k++) {
        long len = bounded_strlen(p, n);
        if (len < 0) {
            why = "PROCESS argv string not terminated inside the record";
            break;
        }
        argv[k] = cs_xstrndup((const char *)p, (size_t)len);
        p += len + 1;
        n -= (size_t)len + 1;
    }
    char *exe = NULL;
    if (!why) {
        long len = n ? bounded_strlen(p, n) : -1;
        if (len < 0)
            why = "PROCESS exe path not terminated inside the record";
        else
            exe = cs_xstrndup((const char *)p, (size_t)len);
    }
    if (why) {
        for (size_t i = 0; i < k; i++)
            free(argv[i]);
        free(argv);
        return why;
    }
    argv[k] = NULL;
    if (t->argv) {
        for (unsigned i = 0; i < t->argc; i++)
            free(t->argv[i]);
        free(t->argv);
        free(t->exe);
    }
    t->argv = argv;
    t->argc = h.argc;
    t->exe = exe;
    t->has_process = 1;
    return NULL;
}

static const char *parse_module(cs_trace *t, const uint8_t *p, size_t n, uint64_t off)
{
    cs_rec_module h;
    if (n < sizeof h)
        return "MODULE record too short";
    memcpy(&h, p, sizeof h);
    p += sizeof h;
    n -= sizeof h;
    if ((uint64_t)h.build_id_len + h.path_len + 1 > n)
        return "MODULE build id and path longer than the record";
    if (p[h.build_id_len + h.path_len] != 0)
        return "MODULE path not terminated";
    if (h.lo > h.hi)
        return "MODULE range has lo > hi";
    struct cs_trace_priv *pr = t->priv;
    if (t->nmodules == pr->modules_cap) {
        pr->modules_cap = pr->modules_cap ? pr->modules_cap * 2 : 64;
        t->modules = cs_xrealloc(t->modules, pr->modules_cap * sizeof *t->modules);
    }
    cs_module_rec *m = &t->modules[t->nmodules++];
    m->base = h.base;
    m->lo = h.lo;
    m->hi = h.hi;
    m->build_id_len = h.build_id_len;
    m->build_id = NULL;
    if (h.build_id_len) {
        m->build_id = cs_xrealloc(NULL, h.build_id_len);
        memcpy(m->build_id, p, h.build_id_len);
    }
    /* a path may hold an embedded NUL in a damaged record: stop there */
    m->path = cs_xstrndup((const char *)p + h.build_id_len,
                       strnlen((const char *)p + h.build_id_len, h.path_len));
    m->offset = off;
    return NULL;
}

static const char *parse_code(cs_trace *t, const uint8_t *p, size_t n)
{
    cs_rec_code h;
    if (n < sizeof h)
        return "CODE record too short";
    memcpy(&h, p, sizeof h);
    p += sizeof h;
    n -= sizeof h;
    if ((uint64_t)h.filename_len + 1 + h.name_len + 1 > n)
        return "CODE strings longer than the record";
    if (p[h.filename_len] != 0 || p[h.filename_len + 1 + h.name_len] != 0)
        return "CODE strings not terminated";
    const char *file = (const char *)p, *name = (const char *)p + h.filename_len + 1;
    codes_put(t->priv, h.code_id, h.firstlineno, file, strnlen(file, h.filename_len),
              name, strnlen(name, h.name_len));
    return NULL;
}

static const char *parse_thread(cs_trace *t, const uint8_t *p, size_t n)
{
    cs_rec_thread h;
    if (n < sizeof h)
        return "THREAD record too short";
    memcpy(&h, p, sizeof h);
    long len = bounded_strlen(p + sizeof h, n - sizeof h);
    if (len < 0)
        return "THREAD name not terminated inside the record";
    struct cs_trace_priv *pr = t->priv;
    if (t->nthreads == pr->threads_cap) {
        pr->threads_cap = pr->threads_cap ? pr->threads_cap * 2 : 16;
        t->threads = cs_xrealloc(t->threads, pr->threads_cap * sizeof *t->threads);
    }
    cs_thread_rec *th = &t->threads[t->nthreads++];
    th->thread = h.thread;
    th->os_tid = h.os_tid;
    th->name = cs_xstrndup((const char *)p + sizeof h, (size_t)len);
    return NULL;
}

static const char *parse_record(cs_trace *t, unsigned type, const uint8_t *p,
                                size_t n, uint64_t off)
{
    switch (type) {
    case CS_REC_PAD:
        return NULL;
    case CS_REC_PROCESS:
        return parse_process(t, p, n);
    case CS_REC_MODULE:
        return parse_module(t, p, n, off);
    case CS_REC_CODE:
        return parse_code(t, p, n);
    case CS_REC_FRAME: {
        cs_rec_frame f;
        if (n < sizeof f)
            return "FRAME record too short";
        memcpy(&f, p, sizeof f);
        if (f.id)                   /* node 0 is the implicit root */
            frames_put(t->priv, f.id, f.parent, f.value);
        return NULL;
    }
    case CS_REC_EVENT: {
        if (n < sizeof(cs_event))
            return "EVENT record too short";
        cs_event ev;
        memcpy(&ev, p, sizeof ev);
        t->nevents++;
        if (t->priv->lc)
            judge(t, &ev);
        return NULL;
    }
    case CS_REC_THREAD:
        return parse_thread(t, p, n);
    case CS_REC_END:
        /* `events` was appended later: older END records lack it */
        if (n < offsetof(cs_rec_end, events))
            return "END record too short";
        memset(&t->end, 0, sizeof t->end);
        memcpy(&t->end, p, n < sizeof t->end ? n : sizeof t->end);
        t->has_end = 1;
        return NULL;
    case CS_REC_OPTIONS: {
        long len = bounded_strlen(p, n);
        if (len < 0)
            return "OPTIONS string not terminated inside the record";
        free(t->options);
        t->options = cs_xstrndup((const char *)p, (size_t)len);
        apply_options(t);
        return NULL;
    }
    case CS_REC_LIVE: {
        cs_rec_live h;
        if (n < sizeof h)
            return "LIVE record too short";
        memcpy(&h, p, sizeof h);
        if (h.nslots > (n - sizeof h) / sizeof(cs_live_slot))
            return "LIVE record shorter than its slots";
        struct cs_trace_priv *pr = t->priv;
        for (uint32_t i = 0; i < h.nslots; i++) {
            cs_live_slot s;
            memcpy(&s, p + sizeof h + i * sizeof s, sizeof s);
            if (!s.obj)
                continue;
            if (pr->nlive == pr->live_cap) {
                pr->live_cap = pr->live_cap ? pr->live_cap * 2 : 64;
                pr->live = cs_xrealloc(pr->live, pr->live_cap * sizeof *pr->live);
            }
            pr->live[pr->nlive++] = s;
        }
        return NULL;
    }
    case CS_REC_COUNTS: {
        cs_rec_counts c;
        if (n < sizeof c)
            return "COUNTS record too short";
        memcpy(&c, p, sizeof c);
        counts_add(t, &c);
        return NULL;
    }
    default:
        t->nunknown++;              /* a newer writer's record: skip it */
        return NULL;
    }
}

static void release_behind(const struct cs_trace_priv *p, uint64_t off, uint64_t *released)
{
    if (off - *released < CS_RELEASE_CHUNK)
        return;
    uint64_t upto = off & ~((uint64_t)CS_RELEASE_CHUNK - 1);
    if (upto > *released) {
        madvise((void *)(p->map + *released), upto - *released, MADV_DONTNEED);
        *released = upto;
    }
}

/* The one pass: validate the framing of every record, load the tables and
 * judge the events. EVENT records are most of a trace and take the short
 * way through the loop. */
static void scan(cs_trace *t)
{
    struct cs_trace_priv *p = t->priv;
    uint64_t off = t->hdr.header_size, released = 0;
    const uint64_t size = p->size;
    char why[160];

    t->data_end = off;
    while (off < size) {
        if (size - off < sizeof(cs_rec)) {
            /* a partial header at the very end: zeros are a clean end */
            for (uint64_t i = off; i < size; i++)
                if (p->map[i]) {
                    corrupt(t, off, "partial record header at end of file");
                    return;
                }
            break;
        }
        cs_rec r;
        memcpy(&r, p->map + off, sizeof r);
        if (r.type == CS_REC_EVENT && r.size == sizeof r + sizeof(cs_event) &&
            r.size <= size - off) {
            cs_event ev;
            memcpy(&ev, p->map + off + sizeof r, sizeof ev);
            t->nevents++;
            if (p->lc)
                judge(t, &ev);
            t->nrecords++;
            off += r.size;
            t->data_end = off;
            if ((off & (CS_RELEASE_CHUNK - 1)) < r.size)
                release_behind(p, off, &released);
            continue;
        }
        if (r.type == CS_REC_END_OF_DATA && r.size == 0 && r.flags == 0) {
            /* the end of what was written; note data beyond it, which
             * only a writer killed between reserving and finishing a
             * record leaves behind */
            for (uint64_t i = off; i < size; i++)
                if (p->map[i]) {
                    t->trailing_offset = i & ~(uint64_t)7;
                    break;
                }
            break;
        }
        if (r.size < sizeof r) {
            snprintf(why, sizeof why, "type %u (%s), size %u < 8", r.type,
                     rec_type_name(r.type), r.size);
            corrupt(t, off, why);
            return;
        }
        if (r.size % 8) {
            snprintf(why, sizeof why, "type %u (%s), size %u not a multiple of 8",
                     r.type, rec_type_name(r.type), r.size);
            corrupt(t, off, why);
            return;
        }
        if (r.size > size - off) {
            snprintf(why, sizeof why, "type %u (%s), size %u runs past the end of the file at 0x%llx",
                     r.type, rec_type_name(r.type), r.size, (unsigned long long)size);
            corrupt(t, off, why);
            return;
        }
        if (r.type == CS_REC_END_OF_DATA) {
            /* the writer stores the type last: a sized record without one
             * was reserved but never committed (its thread was killed or
             * is still writing); records after it are whole, keep going */
            t->nuncommitted++;
            off += r.size;
            t->data_end = off;
            continue;
        }
        const char *bad = parse_record(t, r.type, p->map + off + sizeof r,
                                       r.size - sizeof r, off);
        if (bad) {
            corrupt(t, off, bad);
            return;
        }
        t->nrecords++;
        off += r.size;
        t->data_end = off;
        release_behind(p, off, &released);
    }
}

/* Judge the events again with the final protect setting: only needed when
 * an OPTIONS record came after events (the writer puts it first). */
static void rejudge(cs_trace *t)
{
    struct cs_trace_priv *p = t->priv;
    uint64_t off = t->hdr.header_size, released = 0;
    while (off + sizeof(cs_rec) <= t->data_end) {
        cs_rec r;
        memcpy(&r, p->map + off, sizeof r);
        if (r.size < sizeof r || r.size > t->data_end - off)
            break;                  /* cannot happen after scan(); be safe */
        if (r.type == CS_REC_EVENT && r.size >= sizeof r + sizeof(cs_event)) {
            cs_event ev;
            memcpy(&ev, p->map + off + sizeof r, sizeof ev);
            judge(t, &ev);
        }
        off += r.size;
        release_behind(p, off, &released);
    }
}

cs_trace *cs_trace_open(const char *path, char *err, size_t errlen)
{
    /* O_NONBLOCK: a FIFO given by mistake must not hang the report */
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0) {
        snprintf(err, errlen, "%s: cannot open: %s", path, strerror(errno));
        return NULL;
    }
    struct stat st;
    if (fstat(fd, &st) == 0 && S_ISDIR(st.st_mode)) {
        snprintf(err, errlen, "%s: is a directory, not a trace file (name the traces in it, "
                 "e.g. %s/capsan.trace.*)", path, path);
        close(fd);
        return NULL;
    }
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        snprintf(err, errlen, "%s: not a regular file", path);
        close(fd);
        return NULL;
    }
    if ((uint64_t)st.st_size < sizeof(cs_file_header)) {
        snprintf(err, errlen, "%s: not a capsan trace: %lld bytes, shorter than the "
                 "%zu-byte header at offset 0x0", path, (long long)st.st_size,
                 sizeof(cs_file_header));
        close(fd);
        return NULL;
    }
    size_t size = (size_t)st.st_size;
    const uint8_t *map = mmap(NULL, size, PROT_READ, MAP_PRIVATE, fd, 0);
    close(fd);
    if (map == MAP_FAILED) {
        snprintf(err, errlen, "%s: cannot map: %s", path, strerror(errno));
        return NULL;
    }
    madvise((void *)map, size, MADV_SEQUENTIAL);

    cs_file_header h;
    memcpy(&h, map, sizeof h);
    const char *bad = NULL;
    unsigned long long at = 0;
    if (memcmp(h.magic, CS_TRACE_MAGIC, 8) != 0) {
        bad = "bad magic (expected \"" CS_TRACE_MAGIC "\")";
        at = offsetof(cs_file_header, magic);
    } else if (h.version < 1 || h.version > CS_TRACE_VERSION) {
        snprintf(err, errlen, "%s: unsupported trace format version %u at offset 0x%zx "
                 "(this capsan reads versions 1 to %u)", path, h.version,
                 offsetof(cs_file_header, version), CS_TRACE_VERSION);
        munmap((void *)map, size);
        return NULL;
    } else if (h.header_size < sizeof h || h.header_size % 8 || h.header_size > size) {
        bad = "bad header size";
        at = offsetof(cs_file_header, header_size);
    }
    if (bad) {
        snprintf(err, errlen, "%s: not a capsan trace: %s at offset 0x%llx", path, bad, at);
        munmap((void *)map, size);
        return NULL;
    }

    cs_trace *t = cs_xrealloc(NULL, sizeof *t);
    memset(t, 0, sizeof *t);
    t->priv = cs_xrealloc(NULL, sizeof *t->priv);
    memset(t->priv, 0, sizeof *t->priv);
    struct cs_trace_priv *p = t->priv;
    p->map = map;
    p->size = size;
    t->path = cs_xstrndup(path, strlen(path));
    t->hdr = h;
    t->opt_max_findings = -1;
    t->counts_stride = 1;
    p->lc = cs_lc_create(store_finding, t, 0);
    if (p->lc) /* a forked child's inheritance is its parent's to judge */
        cs_lc_set_born(p->lc, h.start_mono_ns);
    scan(t);
    if (p->lc && p->rereplay) {
        cs_lc_destroy(p->lc);
        findings_clear(t);
        if ((p->lc = cs_lc_create(store_finding, t, 0))) {
            cs_lc_set_protect(p->lc, p->protect);
            cs_lc_set_born(p->lc, h.start_mono_ns);
            rejudge(t);
        }
    }
    if (p->lc) {
        /* killed (no END), or a fatal signal: no leak verdict, but what it
         * held, from its live state */
        if (!t->has_end || t->end.how == CS_END_SIGNAL)
            cs_lc_finish_killed(p->lc, p->live, p->nlive);
        cs_lc_finish(p->lc, t->has_end ? (int)t->end.how : CS_END_UNKNOWN);
        cs_lc_destroy(p->lc);
        p->lc = NULL;
    }
    counts_finish(t);
    /* the tables hold what the report needs: let the file go */
    munmap((void *)p->map, p->size);
    p->map = NULL;
    return t;
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

void cs_trace_close(cs_trace *t)
{
    if (!t)
        return;
    struct cs_trace_priv *p = t->priv;
    if (p->map)
        munmap((void *)p->map, p->size);
    free(p->frames);
    for (size_t i = 0; i < p->ncodes; i++) {
        free(p->codes[i].file);
        free(p->codes[i].name);
    }
    free(p->codes);
    free(p->code_index);
    free(p->fmem);
    free(p->live);
    if (p->spill)
        fclose(p->spill);
    if (p->lc)
        cs_lc_destroy(p->lc);
    free(p);
    free(t->counts);
    if (t->argv)
        for (unsigned i = 0; i < t->argc; i++)
            free(t->argv[i]);
    free(t->argv);
    free(t->exe);
    free(t->options);
    free(t->opt_suppressions);
    for (size_t i = 0; i < t->nmodules; i++) {
        free(t->modules[i].build_id);
        free(t->modules[i].path);
    }
    free(t->modules);
    for (size_t i = 0; i < t->nthreads; i++)
        free(t->threads[i].name);
    free(t->threads);
    free(t->path);
    free(t);
}
