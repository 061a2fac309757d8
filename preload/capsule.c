/* PyCapsule hooks and DLPack trampolines (see capsule.h).
 *
 * Most capsule traffic is not DLPack (import torch alone makes thousands
 * of capsules): each hook decides by the name's first letter before doing
 * anything else. */
#include "capsule.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "capsan.h"
#include "dltensor.h"
#include "numpy.h"
#include "spin.h"
#include "options.h"
#include "pyapi.h"
#include "runtime.h"

enum {
    NK_NONE = 0,
    NK_DL,        /* dltensor */
    NK_DLV,       /* dltensor_versioned */
    NK_USED,      /* used_dltensor */
    NK_USEDV,     /* used_dltensor_versioned */
    NK_NPDL,      /* numpy_dltensor(_versioned): numpy's owner capsule */
};

/* Names are compared on every capsule call, most of them not DLPack's.
 * A name is compared with a literal a word at a time when all the bytes
 * read lie in the page of its first byte (so no read can fault), else
 * with strcmp. */
static inline uint64_t ld8(const char *p)
{
    uint64_t v;
    memcpy(&v, p, 8);
    return v;
}

/* n = sizeof the literal, NUL included, at least 9: whole words, then an
 * overlapping last word. Constant-folds to a few compares. */
static inline int eqn(const char *s, const char *lit, size_t n)
{
    if (((uintptr_t)s & 4095) > 4096 - n)
        return strcmp(s, lit) == 0;
    size_t i = 0;
    for (; i + 8 <= n; i += 8)
        if (ld8(s + i) != ld8(lit + i))
            return 0;
    return i == n || ld8(s + n - 8) == ld8(lit + n - 8);
}
#define eq(s, lit) eqn(s, lit, sizeof lit)

static inline int name_kind(const char *n)
{
    if (!n)
        return NK_NONE;
    switch (n[0]) {
    case 'd':
        if (eq(n, "dltensor"))
            return NK_DL;
        if (eq(n, "dltensor_versioned"))
            return NK_DLV;
        return NK_NONE;
    case 'u':
        if (eq(n, "used_dltensor"))
            return NK_USED;
        if (eq(n, "used_dltensor_versioned"))
            return NK_USEDV;
        return NK_NONE;
    case 'n':
        if (eq(n, "numpy_dltensor") || eq(n, "numpy_dltensor_versioned"))
            return NK_NPDL;
        return NK_NONE;
    }
    return NK_NONE;
}

/* ---- exporting capsules we wrapped: capsule -> original destructor ---- */
typedef struct capent {
    PyObject_ *cap;
    cs_capsule_dtor orig;
    void *mt;
    int versioned;
} capent;

#define CSTRIPES 16
static struct {
    cs_spin mu;
    capent *tab;
    size_t cap, used;
} ctab[CSTRIPES];

static inline size_t chash(const void *p) { return ((uintptr_t)p >> 4) * 0x9e3779b97f4a7c15ull >> 20; }
#define CSTRIPE(p) (&ctab[chash(p) % CSTRIPES])

/* stripe locked */
static capent *cfind(size_t sidx, const void *cap)
{
    if (!ctab[sidx].cap)
        return NULL;
    size_t m = ctab[sidx].cap - 1;
    for (size_t i = chash(cap) & m; ctab[sidx].tab[i].cap; i = (i + 1) & m)
        if (ctab[sidx].tab[i].cap == cap)
            return &ctab[sidx].tab[i];
    return NULL;
}

static int cadd(const capent *e)
{
    size_t s = chash(e->cap) % CSTRIPES;
    cs_spin_lock(&ctab[s].mu);
    if ((ctab[s].used + 1) * 2 > ctab[s].cap) {
        size_t ncap = ctab[s].cap ? ctab[s].cap * 2 : 64;
        capent *nt = calloc(ncap, sizeof *nt);
        if (!nt) {
            cs_spin_unlock(&ctab[s].mu);
            return -1;
        }
        for (size_t j = 0; j < ctab[s].cap; j++) {
            if (!ctab[s].tab[j].cap)
                continue;
            size_t i = chash(ctab[s].tab[j].cap) & (ncap - 1);
            while (nt[i].cap)
                i = (i + 1) & (ncap - 1);
            nt[i] = ctab[s].tab[j];
        }
        free(ctab[s].tab);
        ctab[s].tab = nt;
        ctab[s].cap = ncap;
    }
    size_t m = ctab[s].cap - 1, i = chash(e->cap) & m;
    while (ctab[s].tab[i].cap)
        i = (i + 1) & m;
    ctab[s].tab[i] = *e;
    ctab[s].used++;
    cs_spin_unlock(&ctab[s].mu);
    return 0;
}

/* Copy out (and optionally remove) a capsule's entry. */
static int cget(const void *cap, capent *out, int remove)
{
    size_t s = chash(cap) % CSTRIPES;
    cs_spin_lock(&ctab[s].mu);
    capent *e = cfind(s, cap);
    if (e) {
        *out = *e;
        if (remove) {
            size_t m = ctab[s].cap - 1, i = (size_t)(e - ctab[s].tab);
            for (size_t j = (i + 1) & m; ctab[s].tab[j].cap; j = (j + 1) & m) {
                size_t home = chash(ctab[s].tab[j].cap) & m;
                if (((j - home) & m) >= ((j - i) & m)) {
                    ctab[s].tab[i] = ctab[s].tab[j];
                    i = j;
                }
            }
            memset(&ctab[s].tab[i], 0, sizeof ctab[s].tab[i]);
            ctab[s].used--;
        }
    }
    cs_spin_unlock(&ctab[s].mu);
    return e != NULL;
}

static int cupdate(const void *cap, cs_capsule_dtor orig, void *mt, int set_mt)
{
    size_t s = chash(cap) % CSTRIPES;
    cs_spin_lock(&ctab[s].mu);
    capent *e = cfind(s, cap);
    if (e) {
        if (set_mt)
            e->mt = mt;
        else
            e->orig = orig;
    }
    cs_spin_unlock(&ctab[s].mu);
    return e != NULL;
}

/* ---- trampolines ---- */

static int in_dtor_of(const void *cap)
{
    cs_thread *t = cs_thread_get();
    return t && t->dtor_capsule == cap;
}

static void deleter_tramp(void *mt)
{
    cs_thread *t = cs_thread_get();
    int python = cs_recording && cs_py.ok;
    int live = python && cs_py_live();
    int held = live && cs_gil_held();
    int nogil = live && !held;
    void *dcap = t ? t->dtor_capsule : NULL;
    cs_event ev = {.kind = CS_EV_DELETE, .obj = (uint64_t)(uintptr_t)mt,
                   .a = (uint64_t)(uintptr_t)dcap,
                   .flags = (uint8_t)((dcap ? CS_EVF_IN_DTOR : 0) |
                                      (live ? CS_EVF_GIL_KNOWN | (held ? CS_EVF_GIL : 0) : 0))};
    /* which data this release lets go of: numpy's deleter keeps its array
     * alive when it runs during interpreter shutdown (lifecycle.c) */
    if (python && !live)
        ev.c = cs_dl_data(mt);
    cs_event origin;
    int found = 0;
    unsigned verdict = cs_emit(&ev, 1, &origin, &found);
    if (!found || origin.kind != CS_EV_EXPORT || !origin.b) {
        /* a struct capsan never saw exported (a copied deleter field, or
         * one forgotten long after release): not calling anything is the
         * only safe choice left */
        if (cs_opt.verbosity)
            dprintf(2, "capsan: deleter called for unknown DLManagedTensor %p; not forwarded\n", mt);
        return;
    }
    if (verdict & CS_VERDICT_SKIP)
        return;
    /* torch calls foreign deleters without the GIL (R12): whatever Python
     * the deleter reaches without taking it is reported (cs_check_gil) */
    if (nogil)
        cs_deleter_nogil(1);
    ((void (*)(void *))(uintptr_t)origin.b)(mt);
    if (nogil)
        cs_deleter_nogil(0);
}

static void capsule_dtor_tramp(PyObject_ *cap)
{
    capent e;
    if (!cget(cap, &e, 1))
        return;
    cs_thread *t = cs_thread_get();
    const char *name = cs_py.Capsule_GetName(cap);
    int nk = name_kind(name);
    void *saved = t ? t->dtor_capsule : NULL;
    if (t)
        t->dtor_capsule = cap;
    if (e.orig)
        e.orig(cap);
    if (t)
        t->dtor_capsule = saved;
    if (!cs_recording)
        return;
    cs_event ev = {.kind = CS_EV_DESTROY, .obj = (uint64_t)(uintptr_t)e.mt,
                   .a = (uint64_t)(uintptr_t)cap,
                   .aux = (uint16_t)(nk == NK_DL || nk == NK_DLV     ? CS_NAME_UNCONSUMED
                                     : nk == NK_USED || nk == NK_USEDV ? CS_NAME_USED
                                                                       : CS_NAME_OTHER),
                   .extra = e.orig == NULL};
    /* the death of a consumed capsule is the normal case: the consume
     * already moved its tensor on, and no finding depends on it */
    if (ev.aux != CS_NAME_USED)
        cs_emit(&ev, 1, NULL, NULL);
}

/* ---- hooks ---- */

static void export(void *mt, PyObject_ *cap, int versioned, uint8_t gil_flags)
{
    void **slot = cs_dl_deleter_slot(mt, versioned);
    void *orig = *slot;
    cs_dl_problem probs[8];
    uint64_t nbytes;
    uint32_t fp;
    int np = cs_dl_check(mt, versioned, probs, 8, &nbytes, &fp);
    cs_event ev = {.kind = CS_EV_EXPORT, .obj = (uint64_t)(uintptr_t)mt,
                   .a = (uint64_t)(uintptr_t)cap, .b = (uint64_t)(uintptr_t)orig, .c = nbytes,
                   .aux = versioned ? CS_DLV_VERSIONED : 0,
                   .flags = (uint8_t)((orig ? 0 : CS_EVF_NULL_DELETER) | gil_flags), .extra = fp};
    if (orig == (void *)deleter_tramp) {
        /* exported again while wrapped: keep the original we know */
        cs_event origin;
        int found = 0;
        cs_lc_lock(cs_lc, ev.obj);
        found = cs_lc_origin(cs_lc, CS_NS_DLPACK, ev.obj, &origin);
        cs_lc_unlock(cs_lc, ev.obj);
        ev.b = found ? origin.b : 0;
        ev.flags = ev.b ? 0 : CS_EVF_NULL_DELETER;
    } else if (orig) {
        *slot = (void *)deleter_tramp;
    }
    cs_emit(&ev, 1, NULL, NULL);
    cs_np_check_export_device(ev.obj, cs_dl_data(mt), cs_dl_device_type(mt, versioned));
    for (int i = 0; i < np; i++) {
        cs_event b = {.kind = CS_EV_BAD_TENSOR, .obj = ev.obj, .a = ev.a,
                      .aux = (uint16_t)probs[i].rule, .extra = probs[i].code,
                      .b = (uint64_t)probs[i].value, .stack = ev.stack};
        cs_emit(&b, 0, NULL, NULL);
    }
}

#define GIL_CHECK() cs_check_gil(__builtin_return_address(0), CS_NOGIL_CAPSULE)

static PyObject_ *hook_New(void *ptr, const char *name, cs_capsule_dtor dtor)
{
    int nk = name_kind(name);
    uint8_t g = (uint8_t)GIL_CHECK();
    if (nk == NK_NONE || !cs_recording)
        return cs_py.Capsule_New(ptr, name, dtor);
    /* numpy's own numpy_dltensor capsule, made inside the from_dlpack call
     * whose consume event has the stack, is not an event: the delete it
     * makes later carries numpy's frames */
    if (nk != NK_DL && nk != NK_DLV)
        return cs_py.Capsule_New(ptr, name, dtor);
    PyObject_ *cap = cs_py.Capsule_New(ptr, name, capsule_dtor_tramp);
    if (!cap)
        return NULL;
    capent e = {cap, dtor, ptr, nk == NK_DLV};
    if (cadd(&e) != 0) {
        /* no room to remember the destructor: give the capsule its own */
        cs_py.Capsule_SetDestructor(cap, dtor);
        return cap;
    }
    export(ptr, cap, nk == NK_DLV, g);
    return cap;
}

/* a tracked capsule was given an unconsumed name again (hook_GetPointer) */
static _Atomic int renamed_back;

static int consumer_ignores_offset(const void *ret)
{
    Dl_info di;
    /* torch (through 2.x at least) reads data without byte_offset: R17 */
    return ret && dladdr(ret, &di) && di.dli_fname && strstr(di.dli_fname, "libtorch");
}

static int hook_SetName(PyObject_ *cap, const char *name)
{
    void *ret = __builtin_return_address(0);
    uint8_t g = (uint8_t)GIL_CHECK();
    int nk = name_kind(name);
    if (!cs_recording)
        return cs_py.Capsule_SetName(cap, name);
    capent e;
    if (!cget(cap, &e, 0))
        return cs_py.Capsule_SetName(cap, name);
    int rc = cs_py.Capsule_SetName(cap, name);
    if (rc != 0 || !e.mt)
        return rc;
    if (nk == NK_USED || nk == NK_USEDV) {
        cs_event ev = {.kind = CS_EV_CONSUME, .obj = (uint64_t)(uintptr_t)e.mt,
                       .a = (uint64_t)(uintptr_t)cap, .b = (uint64_t)(uintptr_t)ret,
                       .aux = e.versioned ? CS_DLV_VERSIONED : 0, .flags = g};
        uint64_t off = cs_dl_byte_offset(e.mt, e.versioned);
        if (off && consumer_ignores_offset(ret)) {
            ev.flags |= CS_EVF_OFFSET_IGNORED;
            ev.c = off;
        }
        /* R20: the loaned metadata must not have changed since export */
        cs_event origin;
        int found;
        uint32_t fp = cs_dl_fingerprint(e.mt, e.versioned);
        cs_emit(&ev, 1, &origin, &found);
        if (found && origin.kind == CS_EV_EXPORT && origin.extra && origin.extra != fp) {
            cs_event b = {.kind = CS_EV_BAD_TENSOR, .obj = ev.obj, .a = ev.a, .aux = 20,
                          .extra = CS_BAD_MUTATED, .stack = ev.stack};
            cs_emit(&b, 0, NULL, NULL);
        }
    } else if (nk == NK_DL || nk == NK_DLV) {
        atomic_store_explicit(&renamed_back, 1, memory_order_relaxed);
    } else {
        cs_event b = {.kind = CS_EV_BAD_TENSOR, .obj = (uint64_t)(uintptr_t)e.mt,
                      .a = (uint64_t)(uintptr_t)cap, .aux = 7, .extra = CS_BAD_RENAME};
        cs_emit(&b, 1, NULL, NULL);
    }
    return rc;
}

static void *hook_GetPointer(PyObject_ *cap, const char *name)
{
    GIL_CHECK();
    void *p = cs_py.Capsule_GetPointer(cap, name);
    int nk;
    if (name && name[0] == 'm' && eq(name, "mem_handler")) {
        /* numpy reads the handler right before it allocates or frees */
        cs_np_note_handler(cap, p);
        return p;
    }
    if (!p || !cs_recording || (nk = name_kind(name)) == NK_NONE || nk == NK_NPDL)
        return p;
    if (in_dtor_of(cap))
        return p; /* the producer's destructor reading its own capsule */
    cs_event ev = {.obj = (uint64_t)(uintptr_t)p, .a = (uint64_t)(uintptr_t)cap};
    if (nk == NK_USED || nk == NK_USEDV) {
        ev.kind = CS_EV_GETPTR_USED;
    } else {
        /* a consumer reading an unconsumed capsule: only a released
         * tensor makes that an event. A tensor is released while its
         * capsule still has an unconsumed name only after a finding
         * (dlpack-not-renamed) or a rename back: until then, no lookup */
        if (!cs_findings_judged() && !atomic_load_explicit(&renamed_back, memory_order_relaxed))
            return p;
        cs_lc_lock(cs_lc, ev.obj);
        int st = cs_lc_state(cs_lc, CS_NS_DLPACK, ev.obj);
        cs_lc_unlock(cs_lc, ev.obj);
        if (st != CS_ST_RELEASED)
            return p;
        ev.kind = CS_EV_GETPTR;
    }
    cs_emit(&ev, 1, NULL, NULL);
    return p;
}

static int hook_IsValid(PyObject_ *cap, const char *name)
{
    GIL_CHECK();
    return cs_py.Capsule_IsValid(cap, name);
}

static int hook_SetDestructor(PyObject_ *cap, cs_capsule_dtor d)
{
    GIL_CHECK();
    /* our wrapper stays in place; the new destructor becomes the original */
    if (cupdate(cap, d, NULL, 0))
        return 0;
    return cs_py.Capsule_SetDestructor(cap, d);
}

static cs_capsule_dtor hook_GetDestructor(PyObject_ *cap)
{
    GIL_CHECK();
    capent e;
    cs_capsule_dtor d = cs_py.Capsule_GetDestructor(cap);
    if (d == capsule_dtor_tramp && cget(cap, &e, 0))
        return e.orig;
    return d;
}

static int hook_SetPointer(PyObject_ *cap, void *p)
{
    GIL_CHECK();
    int rc = cs_py.Capsule_SetPointer(cap, p);
    if (rc == 0)
        cupdate(cap, NULL, p, 1);
    return rc;
}

const cs_hook cs_capsule_hooks[] = {
    {"PyCapsule_New", (void *)hook_New, NULL},
    {"PyCapsule_SetName", (void *)hook_SetName, NULL},
    {"PyCapsule_GetPointer", (void *)hook_GetPointer, NULL},
    {"PyCapsule_IsValid", (void *)hook_IsValid, NULL},
    {"PyCapsule_SetDestructor", (void *)hook_SetDestructor, NULL},
    {"PyCapsule_GetDestructor", (void *)hook_GetDestructor, NULL},
    {"PyCapsule_SetPointer", (void *)hook_SetPointer, NULL},
};
const int cs_capsule_nhooks = sizeof cs_capsule_hooks / sizeof cs_capsule_hooks[0];

/* ---- for capsan.describe(): what capsan's wrappers stand in for ---- */

void *capsan_original_destructor(PyObject_ *cap)
{
    capent e;
    if (cap && cget(cap, &e, 0))
        return (void *)(uintptr_t)e.orig;
    return cap ? (void *)(uintptr_t)cs_py.Capsule_GetDestructor(cap) : NULL;
}

void *capsan_original_deleter(void *mt)
{
    cs_event origin;
    int found;
    if (!mt || !cs_lc)
        return NULL;
    cs_lc_lock(cs_lc, (uint64_t)(uintptr_t)mt);
    found = cs_lc_origin(cs_lc, CS_NS_DLPACK, (uint64_t)(uintptr_t)mt, &origin);
    cs_lc_unlock(cs_lc, (uint64_t)(uintptr_t)mt);
    return found && origin.kind == CS_EV_EXPORT ? (void *)(uintptr_t)origin.b : NULL;
}

/* Read a capsule's pointer with its current name and record nothing: an
 * inspection (capsan.describe) is not a consumer. */
void *capsan_capsule_peek(PyObject_ *cap)
{
    const char *name = cap ? cs_py.Capsule_GetName(cap) : NULL;
    return cap ? cs_py.Capsule_GetPointer(cap, name) : NULL;
}
