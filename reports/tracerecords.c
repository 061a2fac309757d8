/* One parser per record type (reports/FORMAT.md): every length and string
 * in a record is checked against the record's size before use; the tables,
 * OPTIONS, COUNTS and the lifecycle each get what is theirs. */
#include "reader_int.h"
#include "util.h"

#include <stddef.h>
#include <stdlib.h>
#include <string.h>

/* A NUL-terminated string at p within avail bytes: its length, or -1. */
static long bounded_strlen(const uint8_t *p, size_t avail)
{
    const uint8_t *z = memchr(p, 0, avail);
    return z ? (long)(z - p) : -1;
}

/* Each parser gets the payload after the cs_rec header; returns NULL when
 * the record is fine or a reason for tracescan.c's corrupt(). */

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
    trace_codes_put(t->priv, h.code_id, h.firstlineno, file, strnlen(file, h.filename_len),
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

void trace_crash_free(cs_trace *t)
{
    for (size_t i = 0; i < t->crash_npy; i++) {
        free((char *)t->crash_py[i].file);
        free((char *)t->crash_py[i].function);
    }
    free(t->crash_py);
    free(t->crash_ips);
    t->crash_py = NULL;
    t->crash_ips = NULL;
    t->crash_npy = t->crash_nnative = 0;
}

static const char *parse_crash(cs_trace *t, const uint8_t *p, size_t n)
{
    cs_rec_crash h;
    if (n < sizeof h)
        return "CRASH record too short";
    memcpy(&h, p, sizeof h);
    if (h.nnative > (n - sizeof h) / sizeof(uint64_t) || h.npython > n)
        return "CRASH record shorter than its stack";
    trace_crash_free(t);
    t->crash_tid = h.os_tid;
    t->crash_nnative = h.nnative;
    t->crash_ips = cs_xcalloc(h.nnative ? h.nnative : 1, sizeof *t->crash_ips);
    memcpy(t->crash_ips, p + sizeof h, h.nnative * sizeof(uint64_t));
    size_t at = sizeof h + h.nnative * sizeof(uint64_t);
    t->crash_py = cs_xcalloc(h.npython ? h.npython : 1, sizeof *t->crash_py);
    for (uint32_t i = 0; i < h.npython; i++) {
        uint32_t line;
        if (n - at < 4)
            return "CRASH record shorter than its Python frames";
        memcpy(&line, p + at, 4);
        at += 4;
        long a = bounded_strlen(p + at, n - at);
        long b = a < 0 ? -1 : bounded_strlen(p + at + a + 1, n - at - (size_t)a - 1);
        if (b < 0)
            return "CRASH frame name not terminated inside the record";
        cs_frame_info *fr = &t->crash_py[t->crash_npy++];
        fr->python = 1;
        fr->line = line;
        fr->file = cs_xstrndup((const char *)p + at, (size_t)a);
        fr->function = cs_xstrndup((const char *)p + at + a + 1, (size_t)b);
        at += (size_t)a + 1 + (size_t)b + 1;
    }
    return NULL;
}

const char *trace_parse_record(cs_trace *t, unsigned type, const uint8_t *p,
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
            trace_frames_put(t->priv, f.id, f.parent, f.value);
        return NULL;
    }
    case CS_REC_EVENT: {
        if (n < sizeof(cs_event))
            return "EVENT record too short";
        cs_event ev;
        memcpy(&ev, p, sizeof ev);
        t->nevents++;
        if (t->priv->lc)
            trace_judge(t, &ev);
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
        trace_apply_options(t);
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
    case CS_REC_CRASH:
        return parse_crash(t, p, n);
    case CS_REC_COUNTS: {
        cs_rec_counts c;
        if (n < sizeof c)
            return "COUNTS record too short";
        memcpy(&c, p, sizeof c);
        trace_counts_add(t, &c);
        return NULL;
    }
    default:
        t->nunknown++;              /* a newer writer's record: skip it */
        return NULL;
    }
}
