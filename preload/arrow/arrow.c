/* The Arrow PyCapsule interface (see arrow.h). */
#include "arrow.h"

#include <errno.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "capsan.h"
#include "names.h"
#include "options.h"
#include "probe.h"
#include "runtime.h"
#include "seenset.h"
#include "spin.h"
#include "stack.h"
#include "thread.h"

/* ---- the structs, x86-64 (C Data, C Stream and C Device interfaces) ----
 * size: what a callback's copy holds (a device array's release gets its
 * embedded ArrowArray); full: what is read at wrap time */
typedef struct layout {
    uint8_t size, full, rel, pd;
    uint8_t stream;            /* get_schema, get_next, get_last_error at sch, sch+8, sch+16 */
    uint8_t sch;
} layout;

static const layout lay[6] = {
    [CS_AR_SCHEMA] = {72, 72, 56, 64, 0, 0},
    [CS_AR_ARRAY] = {80, 80, 64, 72, 0, 0},
    [CS_AR_STREAM] = {40, 40, 24, 32, 1, 0},
    [CS_AR_DEVICE_ARRAY] = {80, 128, 64, 72, 0, 0},
    [CS_AR_DEVICE_STREAM] = {48, 48, 32, 40, 1, 8},
};
#define FIELD(s, off) (*(void **)((char *)(s) + (off)))

/* ---- records: one per exported struct, its identity through moves ---- */
#define AR_MAGIC 0x63617073616e4152ull /* "RAnaspac" */

typedef struct ar_rec {
    uint64_t magic;
    struct ar_rec *next_free;
    uint8_t type;              /* cs_ar_type */
    _Atomic uint8_t wrapping;  /* the trampolines are (being) put in */
    _Atomic uint8_t wrapped;
    _Atomic uint8_t released;  /* its release ran */
    _Atomic uint8_t misuse_said;
    _Atomic uint8_t done;      /* DONE_*: both set, the record may be reused */
    void *home;                /* the struct it was wrapped in */
    void *pd, *release;        /* the producer's private_data and release */
    void *fn[3];               /* a stream's get_schema, get_next, get_last_error */
    _Atomic uint32_t in_call;  /* threads inside its stream callbacks */
    _Atomic uint32_t call_thread;
    PyObject_ *cap;            /* its capsule while that lives */
    /* arrow_deep=1: the records of its children and dictionary (R44), each
     * a kid: no object of the lifecycle's, and no event unless something
     * goes wrong, which is said about the exported struct, its root */
    struct ar_rec *kids, *sib; /* its kids; the next of its parent's */
    struct ar_rec *root;       /* a kid's exported struct */
    int32_t idx;               /* a kid's index among its parent's children, -1 the dictionary */
    uint8_t kid;
    uint8_t expect;            /* its parent's release must release it (set as that starts) */
} ar_rec;
#define DONE_CAPSULE 1u  /* its capsule is gone (or it never had one) */
#define DONE_RELEASED 2u /* released, or nothing will release it through capsan */
#define DONE_PARENT 4u   /* a kid's parent is released: its kids list is not walked again */
#define DONE_ALL (DONE_CAPSULE | DONE_RELEASED | DONE_PARENT)

/* A released record is reused only after QUAR later ones: a stale copy of
 * its struct released late still finds it released. */
#define CHUNK 256
#define QUAR 8192
static cs_spin pool_mu = CS_SPIN_INIT;
static ar_rec *free_list;
static ar_rec *quar[QUAR];
static unsigned qhead, qlen;
/* every chunk, for the scan at exit: records point to records (a kid to
 * its root), which must not make a struct look held */
static ar_rec **chunks;
static size_t nchunks, capchunks;

static ar_rec *rec_alloc(int type)
{
    cs_spin_lock(&pool_mu);
    ar_rec *r = free_list;
    if (r)
        free_list = r->next_free;
    cs_spin_unlock(&pool_mu);
    if (!r) {
        /* never given back (stale copies may read it): pages the kernel
         * zeroes, touched as records are handed out, not cleared here */
        ar_rec *c = mmap(NULL, CHUNK * sizeof *c, PROT_READ | PROT_WRITE,
                         MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (c == MAP_FAILED)
            return NULL;
        cs_spin_lock(&pool_mu);
        if (nchunks == capchunks) {
            size_t nc = capchunks ? capchunks * 2 : 16;
            ar_rec **n = realloc(chunks, nc * sizeof *n);
            if (n) {
                chunks = n;
                capchunks = nc;
            }
        }
        if (nchunks < capchunks)
            chunks[nchunks++] = c;
        for (int i = CHUNK - 1; i >= 1; i--) {
            c[i].next_free = free_list;
            free_list = &c[i];
        }
        cs_spin_unlock(&pool_mu);
        r = &c[0];
    }
    memset(r, 0, sizeof *r);
    r->type = (uint8_t)type;
    r->done = DONE_PARENT; /* a kid's is set by its parent */
    __atomic_store_n(&r->magic, AR_MAGIC, __ATOMIC_RELEASE);
    return r;
}

static void rec_retire(ar_rec *r)
{
    cs_spin_lock(&pool_mu);
    if (qlen == QUAR) {
        ar_rec *old = quar[qhead];
        qhead = (qhead + 1) % QUAR;
        qlen--;
        old->next_free = free_list;
        free_list = old;
    }
    quar[(qhead + qlen++) % QUAR] = r;
    cs_spin_unlock(&pool_mu);
}

static void rec_done(ar_rec *r, unsigned bits)
{
    unsigned prev = atomic_fetch_or(&r->done, (uint8_t)bits);
    if ((prev | bits) == DONE_ALL && prev != DONE_ALL)
        rec_retire(r);
}

static int is_rec(const ar_rec *r)
{
    return r && !((uintptr_t)r & 7) && cs_probe_read(r, sizeof *r) &&
           __atomic_load_n(&r->magic, __ATOMIC_ACQUIRE) == AR_MAGIC && r->type >= CS_AR_SCHEMA &&
           r->type <= CS_AR_DEVICE_STREAM;
}

/* ---- live Arrow capsules: capsule -> record (open addressing) ---- */
typedef struct capent {
    PyObject_ *cap;
    ar_rec *rec;
} capent;
static capent *ctab;
static size_t ccap, cused;
static cs_spin ctab_mu = CS_SPIN_INIT;

static size_t chash(const void *cap, size_t cap_)
{
    return (size_t)((((uintptr_t)cap >> 4) * 0x9e3779b97f4a7c15ull) >> 32) & (cap_ - 1);
}

static void ctab_put_locked(PyObject_ *cap, ar_rec *r)
{
    size_t i = chash(cap, ccap);
    while (ctab[i].cap && ctab[i].cap != cap)
        i = (i + 1) & (ccap - 1);
    if (!ctab[i].cap)
        cused++;
    ctab[i] = (capent){cap, r};
}

static void ctab_put(PyObject_ *cap, ar_rec *r)
{
    cs_spin_lock(&ctab_mu);
    if ((cused + 1) * 2 > ccap) {
        size_t ncap = ccap ? ccap * 2 : 256;
        capent *n = calloc(ncap, sizeof *n), *old = ctab;
        size_t ocap = ccap;
        if (!n) {
            cs_spin_unlock(&ctab_mu);
            return;
        }
        ctab = n;
        ccap = ncap;
        cused = 0;
        for (size_t i = 0; i < ocap; i++)
            if (old[i].cap)
                ctab_put_locked(old[i].cap, old[i].rec);
        free(old);
    }
    ctab_put_locked(cap, r);
    cs_spin_unlock(&ctab_mu);
}

/* the record of cap, taken out of the table when take */
static ar_rec *ctab_get(const PyObject_ *cap, int take)
{
    ar_rec *r = NULL;
    cs_spin_lock(&ctab_mu);
    if (ccap) {
        size_t m = ccap - 1, i = chash(cap, ccap);
        while (ctab[i].cap && ctab[i].cap != cap)
            i = (i + 1) & m;
        if (ctab[i].cap) {
            r = ctab[i].rec;
            if (take) {
                /* backward-shift deletion keeps every probe path whole */
                size_t j = i;
                for (;;) {
                    j = (j + 1) & m;
                    if (!ctab[j].cap)
                        break;
                    size_t home = chash(ctab[j].cap, ccap);
                    if (((j - home) & m) >= ((j - i) & m)) {
                        ctab[i] = ctab[j];
                        i = j;
                    }
                }
                ctab[i] = (capent){0};
                cused--;
            }
        }
    }
    cs_spin_unlock(&ctab_mu);
    return r;
}

void cs_ar_own_memory(void (*fn)(void *ud, const void *p, size_t n), void *ud)
{
    if (ctab)
        fn(ud, ctab, ccap * sizeof *ctab);
    for (size_t i = 0; i < nchunks; i++)
        fn(ud, chunks[i], CHUNK * sizeof *chunks[i]);
    if (chunks)
        fn(ud, chunks, capchunks * sizeof *chunks);
}


/* ---- trampolines ---- */

static void wrap_result(ar_rec *stream, void *out, int type, unsigned from,
                        const uintptr_t *slot);

/* A trampoline's event, its stack from slot on: the return address of
 * the callback foreign code called (its body's own lies in capsan) */
static void emit_from(cs_event *ev, const uintptr_t *slot)
{
    cs_stack_hint = slot;
    cs_emit(ev, 1, NULL, NULL);
}

static void restore(void *copy, const ar_rec *r)
{
    const layout *L = &lay[r->type];
    FIELD(copy, L->pd) = r->pd;
    FIELD(copy, L->rel) = r->release;
    if (L->stream)
        for (int k = 0; k < 3; k++)
            FIELD(copy, L->sch + 8 * k) = r->fn[k];
}

static void release_schema(void *s);
static void release_array(void *s);
static void release_stream(void *s);
static void release_dstream(void *s);
static int get_schema_stream(void *s, void *out);
static int get_next_stream(void *s, void *out);
static const char *get_error_stream(void *s);
static int get_schema_dstream(void *s, void *out);
static int get_next_dstream(void *s, void *out);
static const char *get_error_dstream(void *s);

static void *release_tramp(int type)
{
    switch (type) {
    case CS_AR_SCHEMA: return (void *)release_schema;
    case CS_AR_STREAM: return (void *)release_stream;
    case CS_AR_DEVICE_STREAM: return (void *)release_dstream;
    }
    return (void *)release_array;
}

static void *call_tramp(int type, int k)
{
    static void *const s[3] = {(void *)get_schema_stream, (void *)get_next_stream,
                               (void *)get_error_stream};
    static void *const d[3] = {(void *)get_schema_dstream, (void *)get_next_dstream,
                               (void *)get_error_dstream};
    return type == CS_AR_STREAM ? s[k] : d[k];
}

static int is_release_tramp(const void *f)
{
    return f == (void *)release_schema || f == (void *)release_array ||
           f == (void *)release_stream || f == (void *)release_dstream;
}

/* capsan's fields back in a stream struct (the record in private_data) */
static void rewrap(void *s, ar_rec *r, int with_release)
{
    const layout *L = &lay[r->type];
    FIELD(s, L->pd) = r;
    if (L->stream)
        for (int k = 0; k < 3; k++)
            if (r->fn[k])
                FIELD(s, L->sch + 8 * k) = call_tramp(r->type, k);
    if (with_release)
        FIELD(s, L->rel) = release_tramp(r->type);
}

/* R44, deep: which kids the parent's release about to run must release:
 * those still wrapped where they were (one moved out has release == NULL
 * there, and its mover releases it) */
static void kids_expect(ar_rec *kids)
{
    for (ar_rec *k = kids; k; k = k->sib) {
        const layout *L = &lay[k->type];
        k->expect = !atomic_load(&k->released) && cs_probe_read(k->home, L->size) &&
                    FIELD(k->home, L->rel) == release_tramp(k->type) && FIELD(k->home, L->pd) == k;
    }
}

/* After the parent's release: a kid it was to release and did not is a
 * leak (b: how many, extra: the first one's index, -1 the dictionary, c:
 * its struct). Such a kid, and what hangs below it, is never retired:
 * a late release through it still finds its record. */
static void kids_judge(ar_rec *kids, cs_event *ev)
{
    int32_t first = INT32_MAX;
    for (ar_rec *k = kids, *next; k; k = next) {
        next = k->sib;
        if (k->expect && !atomic_load(&k->released)) {
            ev->b++;
            if (k->idx < first) {
                first = k->idx;
                ev->c = (uint64_t)(uintptr_t)k->home;
            }
            continue;
        }
        rec_done(k, DONE_PARENT);
    }
    if (ev->b) {
        ev->aux |= CS_ARR_KIDS_LEFT;
        ev->extra = (uint32_t)first;
    }
}

/* R42, R44: the release of any copy of a wrapped struct. The producer's
 * release runs on a copy with its own fields restored, and what it leaves
 * is copied back. */
static void release_body(void *self, int type, const uintptr_t *slot)
{
    const layout *L = &lay[type];
    ar_rec *r = FIELD(self, L->pd);
    if (!is_rec(r) || r->type != type) {
        /* not a record: nothing known to forward to, and not calling anything is the
         * only safe choice left */
        FIELD(self, L->rel) = NULL;
        return;
    }
    cs_thread *t = cs_thread_get();
    int again = atomic_exchange(&r->released, 1);
    uint16_t aux = (uint16_t)((again ? CS_ARR_AGAIN : 0) | (self != r->home ? CS_ARR_MOVED : 0) |
                              (t && r->cap && t->dtor_capsule == (void *)r->cap &&
                                       t->dtor_mt == r->home ? CS_ARR_IN_DTOR : 0) |
                              (r->kid ? CS_ARR_CHILD : 0));
    /* a kid's findings are about its root, the struct that was exported */
    uint64_t about = (uint64_t)(uintptr_t)(r->kid ? r->root : r);
    if (again) {
        /* said before it runs: the producer frees its private data again */
        cs_event ev = {.kind = CS_EV_AR_RELEASE, .obj = about, .a = (uint64_t)(uintptr_t)self,
                       .aux = aux, .flags = cs_opt.protect ? CS_EVF_SKIPPED : 0};
        emit_from(&ev, slot);
        if (cs_opt.protect) {
            FIELD(self, L->rel) = NULL;
            return;
        }
    }
    ar_rec *kids = again ? NULL : r->kids;
    if (kids)
        kids_expect(kids);
    _Alignas(8) unsigned char copy[128];
    memcpy(copy, self, L->size);
    restore(copy, r);
    ((void (*)(void *))r->release)(copy);
    void *left = FIELD(copy, L->rel);
    memcpy(self, copy, L->size);
    if (left)
        rewrap(self, r, 1); /* not cleared: a second release is still seen */
    else if (L->stream)
        rewrap(self, r, 0); /* a callback through the released stream is seen */
    if (again)
        return;
    cs_event ev = {.kind = CS_EV_AR_RELEASE, .obj = about, .a = (uint64_t)(uintptr_t)self,
                   .aux = (uint16_t)(aux | (left ? CS_ARR_NOT_CLEARED : 0))};
    if (kids) {
        r->kids = NULL;
        kids_judge(kids, &ev);
    }
    /* a kid released as it should be is no event: only its root's is */
    if (!r->kid || (ev.aux & (CS_ARR_NOT_CLEARED | CS_ARR_KIDS_LEFT)))
        emit_from(&ev, slot);
    rec_done(r, DONE_RELEASED);
}

static void release_schema(void *s) { release_body(s, CS_AR_SCHEMA, CS_CALLER_SLOT()); }
static void release_array(void *s)
{
    /* an ArrowArray, or a device array's embedded one: the record says which */
    ar_rec *r = FIELD(s, 72);
    release_body(s, is_rec(r) && r->type == CS_AR_DEVICE_ARRAY ? CS_AR_DEVICE_ARRAY : CS_AR_ARRAY,
                 CS_CALLER_SLOT());
}
static void release_stream(void *s) { release_body(s, CS_AR_STREAM, CS_CALLER_SLOT()); }
static void release_dstream(void *s) { release_body(s, CS_AR_DEVICE_STREAM, CS_CALLER_SLOT()); }

/* R45, R46: a stream callback (k: 0 get_schema, 1 get_next, 2
 * get_last_error), on a copy with the producer's fields, on any thread */
static uintptr_t call_body(void *self, int type, int k, void *out, const uintptr_t *slot)
{
    const layout *L = &lay[type];
    ar_rec *r = FIELD(self, L->pd);
    if (!is_rec(r) || r->type != type || !r->fn[k])
        return k == 2 ? 0 : (uintptr_t)EINVAL;
    cs_thread *t = cs_thread_get();
    uint32_t me = t ? t->num : 0;
    unsigned inside = atomic_fetch_add(&r->in_call, 1);
    uint32_t other = atomic_load(&r->call_thread);
    if (!inside)
        atomic_store(&r->call_thread, me);
    uint16_t aux = (uint16_t)(k + 1);
    if (atomic_load(&r->released))
        aux |= CS_ARC_RELEASED;
    else if (inside && other != me && !atomic_exchange(&r->misuse_said, 1))
        aux |= CS_ARC_CONCURRENT;
    if (aux & (CS_ARC_RELEASED | CS_ARC_CONCURRENT)) {
        cs_event ev = {.kind = CS_EV_AR_CALL, .obj = (uint64_t)(uintptr_t)r,
                       .a = (uint64_t)(uintptr_t)self, .aux = aux,
                       .extra = (aux & CS_ARC_CONCURRENT) ? other : 0,
                       .flags = (aux & CS_ARC_RELEASED) && cs_opt.protect ? CS_EVF_SKIPPED : 0};
        emit_from(&ev, slot);
        if ((aux & CS_ARC_RELEASED) && cs_opt.protect) {
            atomic_fetch_sub(&r->in_call, 1);
            return k == 2 ? 0 : (uintptr_t)EINVAL;
        }
    }
    _Alignas(8) unsigned char copy[64];
    memcpy(copy, self, L->size);
    restore(copy, r);
    uintptr_t rc;
    if (k == 2)
        rc = (uintptr_t)((const char *(*)(void *))r->fn[k])(copy);
    else
        rc = (uintptr_t)(unsigned)((int (*)(void *, void *))r->fn[k])(copy, out);
    if (FIELD(copy, L->pd) != r->pd)
        r->pd = FIELD(copy, L->pd); /* the producer keeps its state where it likes */
    atomic_fetch_sub(&r->in_call, 1);
    if (k < 2 && rc == 0 && out && cs_opt.arrow_wrap)
        wrap_result(r, out,
                    k == 0 ? CS_AR_SCHEMA : type == CS_AR_STREAM ? CS_AR_ARRAY : CS_AR_DEVICE_ARRAY,
                    k == 0 ? CS_AR_FROM_SCHEMA : CS_AR_FROM_NEXT, slot);
    return rc;
}

static int get_schema_stream(void *s, void *out)
{
    return (int)call_body(s, CS_AR_STREAM, 0, out, CS_CALLER_SLOT());
}
static int get_next_stream(void *s, void *out)
{
    return (int)call_body(s, CS_AR_STREAM, 1, out, CS_CALLER_SLOT());
}
static const char *get_error_stream(void *s)
{
    return (const char *)call_body(s, CS_AR_STREAM, 2, NULL, CS_CALLER_SLOT());
}
static int get_schema_dstream(void *s, void *out)
{
    return (int)call_body(s, CS_AR_DEVICE_STREAM, 0, out, CS_CALLER_SLOT());
}
static int get_next_dstream(void *s, void *out)
{
    return (int)call_body(s, CS_AR_DEVICE_STREAM, 1, out, CS_CALLER_SLOT());
}
static const char *get_error_dstream(void *s)
{
    return (const char *)call_body(s, CS_AR_DEVICE_STREAM, 2, NULL, CS_CALLER_SLOT());
}

/* ---- wrapping ---- */

static void check_failed(ar_rec *r, PyObject_ *cap, unsigned code, uint64_t value, uint32_t stack)
{
    cs_event ev = {.kind = CS_EV_AR_CHECK, .obj = (uint64_t)(uintptr_t)r,
                   .a = (uint64_t)(uintptr_t)cap, .aux = (uint16_t)code, .b = value,
                   .stack = stack};
    cs_emit(&ev, !stack, NULL, NULL);
}

/* arrow_deep=1: records for the children and the dictionary of s (a
 * schema, or an array: a device array's embedded one), wrapped into them
 * as into the struct itself but with no event, so that the parent's
 * release is seen releasing each (R44). O(children) per export. */
#define KIDS_MAX_DEPTH 64
static void wrap_kids(ar_rec *parent, ar_rec *root, void *s, int schema, unsigned depth);

/* r follows s from now on (its release rel, proven writable): the
 * producer's fields kept in r, the trampolines and r put into s, and with
 * arrow_deep its children and dictionary followed too (root: the
 * exported struct r belongs to, depth: r's below it) */
static void take_over(ar_rec *r, ar_rec *root, void *s, void *rel, unsigned depth)
{
    const layout *L = &lay[r->type];
    r->home = s;
    r->pd = FIELD(s, L->pd);
    r->release = rel;
    if (L->stream)
        for (int k = 0; k < 3; k++)
            r->fn[k] = FIELD(s, L->sch + 8 * k);
    rewrap(s, r, 1);
    if (cs_opt.arrow_deep && !L->stream)
        wrap_kids(r, root, s, r->type == CS_AR_SCHEMA, depth);
    atomic_store(&r->wrapped, 1);
}

static void wrap_kid(ar_rec *parent, ar_rec *root, void *c, int type, int32_t idx, unsigned depth)
{
    const layout *L = &lay[type];
    if (!cs_probe_read(c, L->full))
        return;
    void *rel = FIELD(c, L->rel);
    if (!rel || is_release_tramp(rel) || !cs_probe_store(&FIELD(c, L->rel), rel))
        return; /* released, wrapped already (shared), or read-only: not followed */
    ar_rec *k = rec_alloc(type);
    if (!k)
        return;
    k->done = DONE_CAPSULE; /* no capsule; retired once released and its parent done */
    k->kid = 1;
    k->root = root;
    k->idx = idx;
    k->sib = parent->kids;
    parent->kids = k;
    take_over(k, root, c, rel, depth + 1);
}

static void wrap_kids(ar_rec *parent, ar_rec *root, void *s, int schema, unsigned depth)
{
    /* n_children @32 in both; children @40 (schema) / @48, dictionary @48 / @56 */
    int64_t n = *(const int64_t *)((char *)s + 32);
    void **children = FIELD(s, schema ? 40 : 48);
    void *dict = FIELD(s, schema ? 48 : 56);
    if (depth >= KIDS_MAX_DEPTH || n < 0 || n > (1 << 24))
        return;
    if (n && (!children || !cs_probe_read(children, (size_t)n * sizeof *children)))
        n = 0;
    int type = schema ? CS_AR_SCHEMA : CS_AR_ARRAY;
    if (dict)
        wrap_kid(parent, root, dict, type, -1, depth);
    for (int64_t i = 0; i < n; i++)
        if (children[i])
            wrap_kid(parent, root, children[i], type, (int32_t)i, depth);
}

/* Put the record and the trampolines into s (its release set). 0 when it
 * cannot be followed: unreadable or read-only, wrapped already (a
 * producer handing out a struct capsan wrapped), or malformed (*bad). */
static int wrap(ar_rec *r, void *s, unsigned *bad, uint64_t *badval)
{
    const layout *L = &lay[r->type];
    *bad = 0;
    if (!cs_probe_read(s, L->full))
        return 0;
    void *rel = FIELD(s, L->rel);
    if (!rel || is_release_tramp(rel) || atomic_exchange(&r->wrapping, 1))
        return 0;
    if (L->stream) {
        for (int k = 0; k < 3; k++)
            if (!FIELD(s, L->sch + 8 * k) && !*bad) {
                *bad = CS_ARK_NULL_CALLBACK;
                *badval = (uint64_t)(k + 1);
            }
    } else if (r->type == CS_AR_DEVICE_ARRAY) {
        /* R48: a known ArrowDeviceType, and no sync event for CPU memory
         * (the reserved words are not judged: pyarrow 26 leaves them unset) */
        int32_t dt = *(const int32_t *)((char *)s + 88);
        void *sync = FIELD(s, 96);
        if (!((dt >= 1 && dt <= 4) || (dt >= 7 && dt <= 16)) || (dt == 1 && sync)) {
            *bad = CS_ARK_DEVICE;
            *badval = (uint64_t)(uint32_t)dt;
        }
    }
    if (!cs_probe_store(&FIELD(s, L->rel), rel))
        return 0; /* read-only */
    take_over(r, r, s, rel, 0);
    return 1;
}

/* A stream callback's result, owned by its caller from birth */
static void wrap_result(ar_rec *stream, void *out, int type, unsigned from,
                        const uintptr_t *slot)
{
    if (!cs_probe_read(out, lay[type].full) || !FIELD(out, lay[type].rel))
        return; /* the end of the stream */
    ar_rec *r = rec_alloc(type);
    if (!r)
        return;
    r->done = DONE_CAPSULE | DONE_PARENT;
    unsigned bad;
    uint64_t badval = 0;
    if (!wrap(r, out, &bad, &badval)) {
        r->done = 0;
        rec_done(r, DONE_ALL);
        return;
    }
    cs_event ev = {.kind = CS_EV_AR_EXPORT, .obj = (uint64_t)(uintptr_t)r,
                   .b = (uint64_t)(uintptr_t)out, .c = (uint64_t)(uintptr_t)stream,
                   .aux = (uint16_t)(type | from)};
    emit_from(&ev, slot);
    if (bad)
        check_failed(r, NULL, bad, badval, ev.stack);
}

/* ---- capsules ---- */

void cs_ar_new(PyObject_ *cap, void *ptr, int type, int has_dtor, uint8_t gil_flags)
{
    ar_rec *r = rec_alloc(type);
    if (!r)
        return;
    r->cap = cap;
    ctab_put(cap, r);
    cs_event ev = {.kind = CS_EV_AR_EXPORT, .obj = (uint64_t)(uintptr_t)r,
                   .a = (uint64_t)(uintptr_t)cap, .b = (uint64_t)(uintptr_t)ptr,
                   .aux = (uint16_t)(type | (cs_opt.arrow_wrap ? 0 : CS_AR_UNFOLLOWED)),
                   .extra = has_dtor ? 0 : CS_ARDX_NO_DTOR, .flags = gil_flags};
    cs_emit(&ev, 1, NULL, NULL);
}

/* R43: a consumer's read; the struct is wrapped at the first one */
void cs_ar_read(PyObject_ *cap, void *ptr)
{
    ar_rec *r = ctab_get(cap, 0);
    if (!r)
        return; /* made before capsan started, or by a producer it could not follow */
    const layout *L = &lay[r->type];
    if (!cs_probe_read(ptr, (size_t)L->rel + 8))
        return;
    cs_event ev = {.kind = CS_EV_AR_BORROW, .obj = (uint64_t)(uintptr_t)r,
                   .a = (uint64_t)(uintptr_t)cap, .b = (uint64_t)(uintptr_t)ptr};
    unsigned bad = 0;
    uint64_t badval = 0;
    if (!FIELD(ptr, L->rel))
        ev.aux = CS_ARB_RELEASED;
    else if (cs_opt.arrow_wrap && !atomic_load(&r->wrapped))
        wrap(r, ptr, &bad, &badval);
    cs_emit(&ev, 1, NULL, NULL);
    if (bad)
        check_failed(r, cap, bad, badval, ev.stack);
}

void cs_ar_dtor_enter(PyObject_ *cap, void *ptr, int has_dtor, cs_ar_dying *d)
{
    memset(d, 0, sizeof *d);
    ar_rec *r = ctab_get(cap, 1);
    if (!r)
        return;
    d->rec = r;
    d->has_dtor = has_dtor;
    d->released = atomic_load(&r->released);
    const layout *L = &lay[r->type];
    int readable = ptr && cs_probe_read(ptr, (size_t)L->full);
    d->set = readable && FIELD(ptr, L->rel);
    /* moved out: the released source is about to be freed, and a stale copy
     * of the record in freed memory would make the moved struct look held
     * to the scan at exit (nobody reads a released struct's other fields) */
    if (readable && !d->set && FIELD(ptr, L->pd) == r)
        FIELD(ptr, L->pd) = NULL;
    unsigned bad;
    uint64_t badval;
    /* nobody asked: the producer's destructor releases it through capsan */
    if (d->set && has_dtor && cs_opt.arrow_wrap && !atomic_load(&r->wrapped))
        wrap(r, ptr, &bad, &badval);
}

void cs_ar_dtor_exit(PyObject_ *cap, cs_ar_dying *d)
{
    ar_rec *r = d->rec;
    if (!r)
        return;
    int wrapped = atomic_load(&r->wrapped);
    uint16_t aux = d->set        ? (!d->has_dtor || wrapped ? CS_ARD_SET : CS_ARD_UNFOLLOWED)
                   : d->released ? CS_ARD_RELEASED
                   : wrapped     ? CS_ARD_MOVED
                                 : CS_ARD_UNFOLLOWED;
    cs_event ev = {.kind = CS_EV_AR_DESTROY, .obj = (uint64_t)(uintptr_t)r,
                   .a = (uint64_t)(uintptr_t)cap, .aux = aux,
                   .extra = d->has_dtor ? 0 : CS_ARDX_NO_DTOR};
    cs_emit(&ev, 1, NULL, NULL);
    r->cap = NULL;
    /* moved out: its release is still to come, through a copy */
    rec_done(r, aux == CS_ARD_MOVED ? DONE_CAPSULE : DONE_CAPSULE | DONE_RELEASED);
}

void cs_ar_renamed(PyObject_ *cap)
{
    ar_rec *r = ctab_get(cap, 0);
    if (r)
        check_failed(r, cap, CS_ARK_RENAMED, 0, 0);
}

/* R40's near misses, said once per (name, call site): a producer exporting
 * under one makes it at every export */
static uintptr_t bad_names_seen[256];
static cs_spin bad_names_mu = CS_SPIN_INIT;

void cs_ar_bad_name(PyObject_ *cap, const char *name, void *ret, uint8_t gil_flags)
{
    int near = arrow_near_miss(name); /* names.h said so: a short, readable, NUL-ended name */
    if (!near)
        return;
    uint64_t h = 0xcbf29ce484222325ull, w[3] = {0};
    size_t len = strlen(name);
    for (size_t i = 0; i < len; i++)
        h = (h ^ (unsigned char)name[i]) * 0x100000001b3ull;
    h ^= (uint64_t)(uintptr_t)ret * 0x9e3779b97f4a7c15ull;
    if (!cs_seen_first(bad_names_seen, sizeof bad_names_seen / sizeof bad_names_seen[0],
                       &bad_names_mu, (uintptr_t)(h | 1)))
        return;
    memcpy(w, name, len < sizeof w ? len : sizeof w);
    cs_event ev = {.kind = CS_EV_AR_CHECK, .obj = (uint64_t)(uintptr_t)cap, .a = w[0], .b = w[1],
                   .c = w[2], .aux = CS_ARK_BAD_NAME,
                   .extra = (uint32_t)((near & 15) | (near & AR_NEAR_USED ? CS_ARK_NAME_USED : 0)),
                   .flags = gil_flags};
    cs_emit(&ev, 1, NULL, NULL);
}

/* ---- for capsan.describe() ---- */

void *capsan_arrow_original(const void *s, int type, int what)
{
    if (type < CS_AR_SCHEMA || type > CS_AR_DEVICE_STREAM || !cs_probe_read(s, lay[type].full))
        return NULL;
    ar_rec *r = FIELD(s, lay[type].pd);
    if (!is_rec(r) || !atomic_load(&r->wrapped) || r->type != type)
        return NULL;
    return what ? r->pd : r->release;
}
