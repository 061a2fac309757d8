/* The Arrow PyCapsule interface (see arrow.h): what the capsule hooks
 * report of an Arrow capsule (made, read, dying, renamed, a near-miss
 * name), and what capsan.describe() asks of a struct. The records are
 * arrow_rec.c's, the wrapping and the trampolines arrow_wrap.c's. */
#include "arrow.h"

#include <dlfcn.h>
#include <stdatomic.h>
#include <string.h>
#include <unistd.h>

#include "arrow_int.h"
#include "arrow_rec.h"
#include "arrow_wrap.h"
#include "byaddr.h"
#include "capsan.h"
#include "names.h"
#include "options.h"
#include "runtime.h"
#include "seenset.h"
#include "spin.h"

/* ---- capsules ---- */

void cs_ar_new(PyObject_ *cap, void *ptr, int type, int has_dtor, uint8_t gil_flags,
               const void *maker)
{
    cs_ar_note_capsule_struct(ptr); /* filled next by an export: the capsule's */
    ar_rec *r = cs_ar_rec_alloc(type);
    if (!r)
        return;
    r->cap = cap;
    r->maker = maker;
    cs_ar_ctab_put(cap, r);
    cs_event ev = {.kind = CS_EV_AR_EXPORT, .obj = (uint64_t)(uintptr_t)r,
                   .a = (uint64_t)(uintptr_t)cap, .b = (uint64_t)(uintptr_t)ptr,
                   .aux = (uint16_t)(type | (cs_opt.arrow_wrap ? 0 : CS_AR_UNFOLLOWED)),
                   .extra = has_dtor ? 0 : CS_ARDX_NO_DTOR, .flags = gil_flags};
    cs_emit(&ev, 1, NULL, NULL);
}

uint64_t cs_ar_capsule_key(const PyObject_ *cap)
{
    ar_rec *r = cs_ar_ctab_get(cap, 0);
    if (!r)
        return 0;
    /* a struct moved out (release == NULL in the capsule) is its mover's:
     * the capsule no longer holds it. The real GetPointer: no event. */
    PyObject_ *c = (PyObject_ *)(uintptr_t)cap;
    void *p = cs_py.Capsule_GetPointer(c, cs_py.Capsule_GetName(c));
    const layout *L = &lay[r->type];
    if (!p || !cs_probe_read(p, (size_t)L->rel + 8) || !FIELD(p, L->rel)) {
        cs_py.Err_Clear();
        return 0;
    }
    return (uint64_t)(uintptr_t)r;
}

/* R43: a consumer's read; the struct is wrapped at the first one */
/* a and b are code of one library: one loaded object, or two extension
 * modules of one Python package (nanoarrow/_utils and nanoarrow/_schema:
 * a folder with an __init__.py), never two that merely share a folder
 * (site-packages, lib-dynload). Looked up only for a capsule read
 * released: rare. */
static int same_library(const void *a, const void *b)
{
    Dl_info x, y;
    if (!a || !b || !dladdr(a, &x) || !dladdr(b, &y) || !x.dli_fname || !y.dli_fname)
        return 0;
    if (x.dli_fbase == y.dli_fbase)
        return 1;
    const char *sx = strrchr(x.dli_fname, '/'), *sy = strrchr(y.dli_fname, '/');
    size_t n = sx ? (size_t)(sx - x.dli_fname) : 0;
    if (!sx || !sy || (size_t)(sy - y.dli_fname) != n || strncmp(x.dli_fname, y.dli_fname, n))
        return 0;
    char init[4096];
    if (n + sizeof "/__init__.py" > sizeof init)
        return 0;
    memcpy(init, x.dli_fname, n);
    memcpy(init + n, "/__init__.py", sizeof "/__init__.py");
    return access(init, F_OK) == 0;
}

void cs_ar_read(PyObject_ *cap, void *ptr, const void *site)
{
    cs_ar_note_capsule_struct(ptr); /* imported next: the capsule's */
    ar_rec *r = cs_ar_ctab_get(cap, 0);
    if (!r)
        return; /* made before capsan started, or by a producer it could not follow */
    const layout *L = &lay[r->type];
    if (!cs_probe_read(ptr, (size_t)L->rel + 8))
        return;
    cs_event ev = {.kind = CS_EV_AR_BORROW, .obj = (uint64_t)(uintptr_t)r,
                   .a = (uint64_t)(uintptr_t)cap, .b = (uint64_t)(uintptr_t)ptr};
    unsigned bad = 0;
    uint64_t badval = 0;
    if (!FIELD(ptr, L->rel)) /* the maker reading its own placeholder hands nothing over */
        ev.aux = CS_ARB_RELEASED | (same_library(r->maker, site) ? CS_ARB_OWN : 0);
    else if (cs_opt.arrow_wrap && !atomic_load(&r->wrapped))
        cs_ar_wrap(r, ptr, &bad, &badval);
    cs_emit(&ev, 1, NULL, NULL);
    if (bad)
        cs_ar_check_failed(r, cap, bad, badval, ev.stack);
}

void cs_ar_dtor_enter(PyObject_ *cap, void *ptr, int has_dtor, cs_ar_dying *d)
{
    memset(d, 0, sizeof *d);
    cs_ar_forget_capsule_struct(ptr); /* its memory may be reused for a struct by address */
    ar_rec *r = cs_ar_ctab_get(cap, 1);
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
        cs_ar_wrap(r, ptr, &bad, &badval);
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
    /* moved out: its consumer took it and is at work on it (this capsule
     * dies at the end of the consuming call, most often): a child it has
     * moved out by now is born here, on its mover's stack */
    if (aux == CS_ARD_MOVED && r->kids)
        cs_ar_moves_seen(r);
    /* moved out: its release is still to come, through a copy */
    cs_ar_rec_done(r, aux == CS_ARD_MOVED ? DONE_CAPSULE : DONE_CAPSULE | DONE_RELEASED);
}

void cs_ar_renamed(PyObject_ *cap)
{
    ar_rec *r = cs_ar_ctab_get(cap, 0);
    if (r)
        cs_ar_check_failed(r, cap, CS_ARK_RENAMED, 0, 0);
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

/* What capsan follows at address s (capsan.describe(int)): its cs_ar_type
 * | CS_AT_* bits, or 0. The record in its private_data says, and its
 * release is capsan's trampoline, or NULL once moved out or released. */
int capsan_arrow_at(const void *s)
{
    static const int order[] = {CS_AR_DEVICE_STREAM, CS_AR_STREAM, CS_AR_DEVICE_ARRAY,
                                CS_AR_ARRAY, CS_AR_SCHEMA};
    for (int i = 0; i < 5; i++) {
        int t = order[i];
        if (!s || !cs_probe_read(s, lay[t].size))
            continue;
        ar_rec *r = FIELD(s, lay[t].pd);
        void *rel = FIELD(s, lay[t].rel);
        if (!is_rec(r) || r->type != t || (rel && !cs_ar_is_tramp(rel, t)))
            continue;
        return t | (atomic_load(&r->released) ? CS_AT_RELEASED : 0) |
               (!rel ? CS_AT_EMPTY : 0) | ((r->byaddr & BA_BORN) ? CS_AT_BY_ADDR : 0) |
               ((r->byaddr & BA_IMPORTED) ? CS_AT_IMPORTED : 0) | (r->cap ? CS_AT_CAPSULE : 0) |
               (r->kid ? CS_AT_CHILD : 0);
    }
    return 0;
}
