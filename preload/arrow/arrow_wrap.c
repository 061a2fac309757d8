/* A struct followed (see arrow_wrap.h): capsan's record and trampolines
 * put into it, and the trampolines themselves, which run the producer's
 * release and stream callbacks on a copy with its own fields restored.
 * One file: wrapping puts the trampolines in, a release puts them back
 * and a stream callback wraps the struct it hands out. */
#include "arrow_wrap.h"
#include "arrow_home.h"

#include <errno.h>
#include <stdatomic.h>
#include <string.h>

#include "arrow_rec.h"
#include "options.h"
#include "runtime.h"
#include "stack.h"
#include "thread.h"

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

int cs_ar_is_tramp(const void *f, int type)
{
    return f && f == release_tramp(type);
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

/* A kid moved out of its parent (release == NULL where it was, its
 * record still there) is from now on an object of its own, born where
 * the move is first seen (slot: the stack's start, NULL for here): a
 * mover that never releases it leaks it. 1 when k is still in place. */
static int kid_moved(ar_rec *k, const uintptr_t *slot)
{
    const layout *L = &lay[k->type];
    int here = !atomic_load(&k->released) && cs_probe_read(k->home, L->size) &&
               FIELD(k->home, L->pd) == k;
    if (!here || FIELD(k->home, L->rel) ||
        (__atomic_fetch_or(&k->byaddr, BA_MOVED, __ATOMIC_ACQ_REL) & BA_MOVED))
        return here;
    /* the moved-from struct is freed with its parent: a stale copy of the
     * record there would make the moved kid look held at exit */
    FIELD(k->home, L->pd) = NULL;
    cs_event ev = {.kind = CS_EV_AR_EXPORT, .obj = (uint64_t)(uintptr_t)k,
                   .b = (uint64_t)(uintptr_t)k->home, .c = (uint64_t)(uintptr_t)k->root,
                   .aux = (uint16_t)(k->type | CS_AR_MOVED_KID | (slot ? 0 : CS_AR_MOVED_EARLY))};
    emit_from(&ev, slot);
    return 0;
}

/* R44, deep: which kids the parent's release about to run must release:
 * those still wrapped where they were. One moved out has release == NULL
 * there and its mover releases it. */
static void kids_expect(ar_rec *kids, const uintptr_t *slot)
{
    for (ar_rec *k = kids; k; k = k->sib)
        k->expect = kid_moved(k, slot) && FIELD(k->home, lay[k->type].rel) == release_tramp(k->type);
}

/* the kids tree is as deep as wrap_kids made it (KIDS_MAX_DEPTH) */
void cs_ar_moves_seen(ar_rec *r)
{
    if (atomic_load(&r->released))
        return;
    for (ar_rec *k = r->kids; k; k = k->sib)
        if (kid_moved(k, NULL))
            cs_ar_moves_seen(k);
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
        cs_ar_rec_done(k, DONE_PARENT);
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
    /* a kid moved out of its parent is an object of its own */
    int kid = r->kid && !(r->byaddr & BA_MOVED);
    uint16_t aux = (uint16_t)((again ? CS_ARR_AGAIN : 0) | (self != r->home ? CS_ARR_MOVED : 0) |
                              (t && r->cap && t->dtor_capsule == (void *)r->cap &&
                                       t->dtor_mt == r->home ? CS_ARR_IN_DTOR : 0) |
                              (kid ? CS_ARR_CHILD : 0));
    /* a kid's findings are about its root, the struct that was exported */
    uint64_t about = (uint64_t)(uintptr_t)(kid ? r->root : r);
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
    /* R45: a release while another thread is inside one of the stream's
     * callbacks (two free-threaded Python threads sharing a reader): the
     * producer frees what that callback still uses */
    if (L->stream && !again && atomic_load(&r->in_call)) {
        uint32_t other = atomic_load(&r->call_thread);
        if (other != (t ? t->num : 0) && !atomic_exchange(&r->misuse_said, 1)) {
            cs_event ev = {.kind = CS_EV_AR_CALL, .obj = about, .a = (uint64_t)(uintptr_t)self,
                           .aux = CS_ARC_RELEASE | CS_ARC_CONCURRENT, .extra = other};
            emit_from(&ev, slot);
        }
    }
    if (!again)
        r->rel_at = self;
    ar_rec *kids = again ? NULL : r->kids;
    if (kids)
        kids_expect(kids, slot);
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
    if (L->stream)
        cs_ar_home_forget(r);
    /* a kid released as it should be is no event: only its root's is */
    if (!kid || (ev.aux & (CS_ARR_NOT_CLEARED | CS_ARR_KIDS_LEFT)))
        emit_from(&ev, slot);
    cs_ar_rec_done(r, DONE_RELEASED);
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

/* The first data buffer of an array or of its first columns, 0 if none */
static uint64_t first_data(const void *a, int depth)
{
    const layout *L = &lay[CS_AR_ARRAY];
    if (!cs_probe_read(a, L->size) || !FIELD(a, L->rel))
        return 0;
    int64_t nb = *(const int64_t *)((const char *)a + 24), nc = *(const int64_t *)((const char *)a + 32);
    const void *const *buf = FIELD(a, 40);
    for (int64_t i = 1; buf && i < nb && i < 4; i++)
        if (cs_probe_read(&buf[i], sizeof buf[i]) && buf[i])
            return (uint64_t)(uintptr_t)buf[i];
    void *const *kids = FIELD(a, 48);
    for (int64_t i = 0; depth < 4 && kids && i < nc && i < 8; i++)
        if (cs_probe_read(&kids[i], sizeof kids[i])) {
            uint64_t d = first_data(kids[i], depth + 1);
            if (d)
                return d;
        }
    return 0;
}

/* A stream's first batch: where its data lies, once, so that memory the
 * stream keeps alive (a NumPy block a producer shares zero-copy) is told
 * as part of the stream's leak (an AR_CALL with b set, no misuse) */
static void tell_data(ar_rec *r, void *out, int type, const uintptr_t *slot)
{
    (void)type; /* a device array starts with its ArrowArray */
    uint64_t d = first_data(out, 0);
    if (!d || atomic_exchange(&r->data_said, 1))
        return;
    cs_event ev = {.kind = CS_EV_AR_CALL, .obj = (uint64_t)(uintptr_t)r, .aux = 2, .b = d};
    emit_from(&ev, slot);
}

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
        aux |= CS_ARC_RELEASED | (self == r->rel_at ? CS_ARC_SAME : 0);
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
    if (!(aux & CS_ARC_RELEASED))
        cs_ar_home_note(r, self);
    if (k == 1 && rc == 0 && out && !atomic_load(&r->data_said))
        tell_data(r, out, type, slot);
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

void cs_ar_check_failed(ar_rec *r, PyObject_ *cap, unsigned code, uint64_t value, uint32_t stack)
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
    if (cs_opt.arrow_deep && !L->stream && !(r->byaddr & BA_SHALLOW))
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
    ar_rec *k = cs_ar_rec_alloc(type);
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

int cs_ar_wrap(ar_rec *r, void *s, unsigned *bad, uint64_t *badval)
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
    ar_rec *r = cs_ar_rec_alloc(type);
    if (!r)
        return;
    r->done = DONE_CAPSULE | DONE_PARENT;
    unsigned bad;
    uint64_t badval = 0;
    if (!cs_ar_wrap(r, out, &bad, &badval)) {
        r->done = 0;
        cs_ar_rec_done(r, DONE_ALL);
        return;
    }
    cs_event ev = {.kind = CS_EV_AR_EXPORT, .obj = (uint64_t)(uintptr_t)r,
                   .b = (uint64_t)(uintptr_t)out, .c = (uint64_t)(uintptr_t)stream,
                   .aux = (uint16_t)(type | from)};
    emit_from(&ev, slot);
    if (bad)
        cs_ar_check_failed(r, NULL, bad, badval, ev.stack);
}
