/* Saved reports (savedreport.h). Each distinct frame and stack of the file
 * is kept once, so that identical leaks share a stack id and group as
 * they do in a trace. Stack values are frame numbers (1-based; never the
 * Python-frame bit), and the stack source hands each frame back as it was
 * saved, or as DWARF names it (pathsym.h). */
#include "savedreport.h"
#include "jsonparse.h"
#include "pathsym.h"
#include "util.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define MAX_FILE (1ull << 30)         /* larger is no report the plugin wrote */
#define MAX_STACK CS_MAX_FRAMES

typedef struct sframe {
    cs_frame_info f;          /* strings point into the parsed document */
    size_t module;            /* pathsym's module number; 0: none to symbolize with */
    uint64_t hash;
} sframe;

typedef struct sstack {
    size_t first, n;          /* values[first, first + n) */
    uint64_t hash;
} sstack;

struct cs_saved_priv {
    cs_jv *doc;
    sframe *frames;
    size_t nframes, fcap;
    size_t *fidx;             /* open addressing: frame number, 0 empty */
    size_t fidx_cap;
    uint64_t *values;
    size_t nvalues, vcap;
    sstack *stacks;
    size_t nstacks, scap;
    size_t *sidx;
    size_t sidx_cap;
    cs_pathsym *sym;
};

typedef struct cs_saved_priv priv;

static uint64_t mix(uint64_t h, const char *s)
{
    for (; s && *s; s++)
        h = (h ^ (unsigned char)*s) * 1099511628211ull;
    return (h ^ 0xff) * 1099511628211ull; /* NULL, "" and "a" differ from "a" + "" */
}

static int same_str(const char *a, const char *b)
{
    return a == b || (a && b && strcmp(a, b) == 0);
}

static const char *opt_str(const cs_jv *o, const char *key)
{
    const char *s = cs_jv_str(o, key);
    return *s ? s : NULL;
}

/* a build id is hex, or none */
static const char *hex_str(const cs_jv *o, const char *key)
{
    const char *s = opt_str(o, key);
    for (const char *p = s; p && *p; p++)
        if (!((*p >= '0' && *p <= '9') || (*p >= 'a' && *p <= 'f')))
            return NULL;
    return s;
}

/* ---- interning ---- */

static int same_frame(const cs_frame_info *a, const cs_frame_info *b)
{
    return a->python == b->python && a->line == b->line && a->address == b->address &&
           a->offset == b->offset && a->inlined == b->inlined &&
           same_str(a->function, b->function) && same_str(a->file, b->file) && same_str(a->module, b->module) &&
           same_str(a->build_id, b->build_id);
}

static void rehash(size_t **idx, size_t *cap, size_t n, const void *items, size_t stride,
                   size_t hash_off)
{
    size_t ncap = *cap ? *cap * 2 : 256;
    while (ncap < 2 * (n + 1))
        ncap *= 2;
    size_t *t = cs_xcalloc(ncap, sizeof *t);
    for (size_t i = 0; i < n; i++) {
        uint64_t h;
        memcpy(&h, (const char *)items + i * stride + hash_off, sizeof h);
        size_t j = cs_hash64(h) & (ncap - 1);
        while (t[j])
            j = (j + 1) & (ncap - 1);
        t[j] = i + 1;
    }
    free(*idx);
    *idx = t;
    *cap = ncap;
}

/* the frame's number (1-based) */
static uint64_t frame_of(priv *p, const cs_jv *fr)
{
    sframe s;
    memset(&s, 0, sizeof s);
    s.f.python = cs_jv_bool(fr, "python");
    s.f.function = opt_str(fr, "function");
    s.f.file = opt_str(fr, "file");
    uint64_t line = cs_jv_uint(fr, "line", 0);
    s.f.line = line > UINT32_MAX ? 0 : (uint32_t)line;
    if (!s.f.python) {
        s.f.module = opt_str(fr, "module_path");
        if (!s.f.module)
            s.f.module = opt_str(fr, "module");
        s.f.address = cs_jv_hex(fr, "address");
        s.f.offset = cs_jv_hex(fr, "offset");
        s.f.build_id = hex_str(fr, "build_id");
        s.f.inlined = cs_jv_bool(fr, "inlined");
    }
    uint64_t h = mix(mix(mix(mix(1469598103934665603ull, s.f.function), s.f.file), s.f.module),
                     s.f.build_id);
    h = cs_hash64(h ^ cs_hash64(s.f.address ^ (s.f.offset << 1) ^ ((uint64_t)s.f.line << 32) ^
                                (uint64_t)(s.f.python | s.f.inlined << 1)));
    s.hash = h;
    if (2 * (p->nframes + 1) > p->fidx_cap)
        rehash(&p->fidx, &p->fidx_cap, p->nframes, p->frames, sizeof *p->frames,
               offsetof(sframe, hash));
    size_t j = cs_hash64(h) & (p->fidx_cap - 1);
    for (; p->fidx[j]; j = (j + 1) & (p->fidx_cap - 1)) {
        const sframe *o = &p->frames[p->fidx[j] - 1];
        if (o->hash == h && same_frame(&o->f, &s.f))
            return p->fidx[j];
    }
    /* a module path only once the frame is new: the table is a linear scan */
    if (!s.f.python && !s.f.inlined)
        s.module = cs_pathsym_module(p->sym, s.f.module, s.f.build_id);
    if (p->nframes == p->fcap) {
        p->fcap = p->fcap ? p->fcap * 2 : 256;
        p->frames = cs_xrealloc(p->frames, p->fcap * sizeof *p->frames);
    }
    p->frames[p->nframes++] = s;
    p->fidx[j] = p->nframes;
    return p->nframes;
}

/* the stack's id (1-based), 0 for none */
static uint32_t stack_of(priv *p, const cs_jv *st)
{
    if (!st || st->type != CS_JV_ARR || !st->n)
        return 0;
    size_t n = st->n < MAX_STACK ? st->n : MAX_STACK;
    if (p->nvalues + n > p->vcap) {
        p->vcap = p->vcap ? p->vcap * 2 : 4096;
        while (p->nvalues + n > p->vcap)
            p->vcap *= 2;
        p->values = cs_xrealloc(p->values, p->vcap * sizeof *p->values);
    }
    uint64_t *v = p->values + p->nvalues, h = 0;
    for (size_t i = 0; i < n; i++) {
        v[i] = frame_of(p, &st->items[i]);
        h = cs_hash64(h ^ v[i]);
    }
    if (2 * (p->nstacks + 1) > p->sidx_cap)
        rehash(&p->sidx, &p->sidx_cap, p->nstacks, p->stacks, sizeof *p->stacks,
               offsetof(sstack, hash));
    size_t j = cs_hash64(h) & (p->sidx_cap - 1);
    for (; p->sidx[j]; j = (j + 1) & (p->sidx_cap - 1)) {
        const sstack *o = &p->stacks[p->sidx[j] - 1];
        if (o->hash == h && o->n == n && !memcmp(p->values + o->first, v, n * sizeof *v))
            return (uint32_t)p->sidx[j];
    }
    if (p->nstacks >= UINT32_MAX - 1)
        return 0;
    if (p->nstacks == p->scap) {
        p->scap = p->scap ? p->scap * 2 : 256;
        p->stacks = cs_xrealloc(p->stacks, p->scap * sizeof *p->stacks);
    }
    p->stacks[p->nstacks++] = (sstack){.first = p->nvalues, .n = n, .hash = h};
    p->nvalues += n;
    p->sidx[j] = p->nstacks;
    return (uint32_t)p->nstacks;
}

/* ---- findings ---- */

/* 0 when the event has no record (a report of a capsan before records) */
static int event_from(priv *p, const cs_jv *ev, cs_event *out)
{
    const cs_jv *rec = cs_jv_get(ev, "record");
    memset(out, 0, sizeof *out);
    if (!rec || rec->type != CS_JV_OBJ)
        return 0;
    out->kind = (uint8_t)cs_jv_uint(rec, "kind", 0);
    out->aux = (uint16_t)cs_jv_uint(rec, "aux", 0);
    out->obj = cs_jv_hex(rec, "obj");
    out->a = cs_jv_hex(rec, "a");
    out->b = cs_jv_hex(rec, "b");
    out->c = cs_jv_hex(rec, "c");
    out->extra = (uint32_t)cs_jv_uint(rec, "extra", 0);
    out->flags = (uint8_t)cs_jv_uint(ev, "flags", 0);
    out->thread = (uint32_t)cs_jv_uint(ev, "thread", 0);
    out->time_ns = cs_jv_uint(ev, "time_ns", 0);
    out->stack = stack_of(p, cs_jv_get(ev, "stack"));
    return 1;
}

enum { FR_OK, FR_UNKNOWN_KIND, FR_NO_RECORDS };

static int finding_from(priv *p, const cs_jv *fo, cs_finding *f)
{
    memset(f, 0, sizeof *f);
    int kind = cs_kind_from_name(cs_jv_str(fo, "kind"));
    if (kind == CS_KIND_NONE)
        return FR_UNKNOWN_KIND;
    f->kind = (uint16_t)kind;
    f->detail = (uint32_t)cs_jv_uint(fo, "detail", 0);
    f->obj = cs_jv_hex(cs_jv_get(fo, "object"), "address");
    f->bytes = cs_jv_uint(fo, "bytes", 0);
    f->value = cs_jv_hex(fo, "value");
    const cs_jv *evs = cs_jv_get(fo, "events");
    if (evs && evs->type == CS_JV_ARR)
        for (size_t i = 0; i < evs->n && f->nevents < CS_FINDING_MAX_EVENTS; i++)
            if (!event_from(p, &evs->items[i], &f->events[f->nevents++]))
                return FR_NO_RECORDS;
    uint64_t nind = cs_jv_uint(fo, "indirect_objects", 0);
    f->nindirect = nind > UINT32_MAX ? UINT32_MAX : (uint32_t)nind;
    f->indirect_bytes = cs_jv_uint(fo, "indirect_bytes", 0);
    const cs_jv *ind = cs_jv_get(fo, "indirect");
    for (size_t i = 0; ind && ind->type == CS_JV_ARR && i < ind->n && i < CS_FINDING_MAX_INDIRECT;
         i++) {
        const cs_jv *io = &ind->items[i];
        cs_indirect *in = &f->indirect[i];
        in->kind = (uint16_t)cs_kind_from_name(cs_jv_str(io, "kind"));
        in->obj = cs_jv_hex(cs_jv_get(io, "object"), "address");
        in->bytes = cs_jv_uint(io, "bytes", 0);
        const cs_jv *ie = cs_jv_get(io, "events");
        if (ie && ie->type == CS_JV_ARR && ie->n && !event_from(p, &ie->items[0], &in->alloc))
            return FR_NO_RECORDS;
    }
    return FR_OK;
}

/* ---- the document ---- */

int cs_saved_sniff(const char *path)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK); /* never wait on a FIFO */
    if (fd < 0)
        return 0;
    char buf[256];
    ssize_t n = read(fd, buf, sizeof buf);
    close(fd);
    for (ssize_t i = 0; i < n; i++) {
        if (buf[i] == ' ' || buf[i] == '\n' || buf[i] == '\r' || buf[i] == '\t')
            continue;
        return buf[i] == '{';
    }
    return 0;
}

static char *slurp(const char *path, size_t *len, char *err, size_t errlen)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    struct stat st;
    if (fd < 0 || fstat(fd, &st) != 0) {
        snprintf(err, errlen, "%s: cannot open: %s", path, strerror(errno));
        if (fd >= 0)
            close(fd);
        return NULL;
    }
    if (!S_ISREG(st.st_mode) || (uint64_t)st.st_size > MAX_FILE) {
        snprintf(err, errlen, "%s: not a regular file of at most 1 GiB", path);
        close(fd);
        return NULL;
    }
    size_t size = (size_t)st.st_size, got = 0;
    char *buf = cs_xrealloc(NULL, size + 1);
    while (got < size) {
        ssize_t r = read(fd, buf + got, size - got);
        if (r <= 0)
            break;
        got += (size_t)r;
    }
    close(fd);
    *len = got;
    return buf;
}

static void add_test(cs_saved *s, size_t *cap, const char *nodeid, size_t first)
{
    if (s->nfindings == first)
        return;
    if (s->ntests == *cap) {
        *cap = *cap ? *cap * 2 : 16;
        s->tests = cs_xrealloc(s->tests, *cap * sizeof *s->tests);
    }
    s->tests[s->ntests++] =
        (cs_saved_test){.nodeid = nodeid, .first = first, .n = s->nfindings - first};
}

/* every finding of a JSON array; FR_NO_RECORDS stops */
static int add_findings(cs_saved *s, size_t *cap, const cs_jv *arr)
{
    for (size_t i = 0; arr && arr->type == CS_JV_ARR && i < arr->n; i++) {
        if (s->nfindings == *cap) {
            *cap = *cap ? *cap * 2 : 64;
            s->findings = cs_xrealloc(s->findings, *cap * sizeof *s->findings);
            s->allowed = cs_xrealloc(s->allowed, *cap);
        }
        int r = finding_from(s->priv, &arr->items[i], &s->findings[s->nfindings]);
        if (r == FR_NO_RECORDS)
            return r;
        if (r == FR_UNKNOWN_KIND) {
            s->skipped++;
            continue;
        }
        s->allowed[s->nfindings++] = (unsigned char)cs_jv_bool(&arr->items[i], "allowed");
    }
    return FR_OK;
}

cs_saved *cs_saved_open(const char *path, char *err, size_t errlen)
{
    size_t len;
    char *text = slurp(path, &len, err, errlen);
    if (!text)
        return NULL;
    char perr[200];
    cs_jv *doc = cs_jv_parse(text, len, perr, sizeof perr);
    free(text);
    if (!doc) {
        snprintf(err, errlen, "%s: not a capsan trace, and not JSON either: %s", path, perr);
        return NULL;
    }
    const cs_jv *tests = cs_jv_get(doc, "tests");
    if (strcmp(cs_jv_str(doc, "tool"), "capsan") != 0 || !tests || tests->type != CS_JV_ARR) {
        snprintf(err, errlen, "%s: JSON, but not a capsan pytest report (pytest --capsan "
                 "--capsan-report=PATH writes those)", path);
        cs_jv_free(doc);
        return NULL;
    }
    cs_saved *s = cs_xcalloc(1, sizeof *s);
    s->priv = cs_xcalloc(1, sizeof *s->priv);
    s->priv->doc = doc;
    s->priv->sym = cs_pathsym_create();
    s->pid = cs_jv_uint(doc, "pid", 0);
    s->ppid = cs_jv_uint(doc, "ppid", 0);
    s->exe = cs_jv_str(doc, "exe");
    const cs_jv *st = cs_jv_get(doc, "status");
    s->status = st && st->type == CS_JV_NUM && st->is_uint && st->u < 256 ? (int)st->u : -1;
    const cs_jv *argv = cs_jv_get(doc, "argv");
    if (argv && argv->type == CS_JV_ARR && argv->n) {
        s->argv = cs_xcalloc(argv->n, sizeof *s->argv);
        for (size_t i = 0; i < argv->n && i < UINT32_MAX; i++)
            s->argv[s->argc++] = argv->items[i].type == CS_JV_STR ? argv->items[i].str : "";
    }
    size_t tcap = 0, fcap = 0;
    int r = FR_OK;
    for (size_t i = 0; i < tests->n && r == FR_OK; i++) {
        const cs_jv *t = &tests->items[i];
        size_t first = s->nfindings;
        r = add_findings(s, &fcap, cs_jv_get(t, "findings"));
        add_test(s, &tcap, cs_jv_str(t, "nodeid"), first);
        s->ntraced++;
    }
    size_t first = s->nfindings;
    if (r == FR_OK)
        r = add_findings(s, &fcap, cs_jv_get(doc, "outside_tests"));
    add_test(s, &tcap, NULL, first);
    if (r == FR_NO_RECORDS) {
        snprintf(err, errlen, "%s: a pytest report whose findings have no event records "
                 "(written by an older capsan): run the tests again to get one this report "
                 "can render", path);
        cs_saved_close(s);
        return NULL;
    }
    return s;
}

void cs_saved_close(cs_saved *s)
{
    if (!s)
        return;
    priv *p = s->priv;
    cs_pathsym_destroy(p->sym);
    free(p->frames);
    free(p->fidx);
    free(p->values);
    free(p->stacks);
    free(p->sidx);
    cs_jv_free(p->doc);
    free(p);
    free(s->argv);
    free(s->tests);
    free(s->findings);
    free(s->allowed);
    free(s);
}

/* ---- the stack source ---- */

static int src_raw(void *ud, uint32_t stack, uint64_t *values, int max)
{
    priv *p = ((cs_saved *)ud)->priv;
    if (!stack || stack > p->nstacks || max <= 0)
        return 0;
    const sstack *st = &p->stacks[stack - 1];
    size_t n = st->n < (size_t)max ? st->n : (size_t)max;
    memcpy(values, p->values + st->first, n * sizeof *values);
    return (int)n;
}

static int src_native(void *ud, uint64_t v, cs_frame_info *out, int max)
{
    cs_saved *s = ud;
    priv *p = s->priv;
    if (!v || v > p->nframes || max <= 0)
        return 0;
    const sframe *fr = &p->frames[v - 1];
    if (fr->module) {
        /* DWARF's answer when it named the code; else the runtime's */
        int n = cs_pathsym_native(p->sym, fr->module, fr->f.offset, out, max);
        if (n > 0) {
            for (int j = 0; j < n; j++) {
                out[j].address = fr->f.address;
                out[j].offset = fr->f.offset;
            }
            if (!out[n - 1].function)
                out[n - 1].function = fr->f.function;
            return n;
        }
    }
    out[0] = fr->f;
    return 1;
}

static int src_code(void *ud, uint32_t code_id, const char **file, const char **name)
{
    (void)ud;
    (void)code_id;
    (void)file;
    (void)name;
    return 0; /* saved Python frames are whole frames (src_native) */
}

cs_stack_source cs_saved_source(cs_saved *s)
{
    return (cs_stack_source){.ud = s, .raw = src_raw, .native = src_native, .code = src_code};
}
