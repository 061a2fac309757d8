/* capsan.handler(): the tracing handler (a mem_handler capsule that
 * forwards every call to the handler it wraps) and the Python-facing
 * entry points around it (capsan_get_handler, capsan_set_handler,
 * capsan_handler_*), numpy's API table read as import_array does. */
#include "numpy_int.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "growclean.h"
#include "pyapi.h"
#include "runtime.h"
#include "young.h"

#define API_SET_HANDLER 304
#define API_GET_HANDLER 305
#define API_FEATURE_VERSION 211
#define NPY_1_22_API_VERSION 0xf /* NEP 49 handlers appeared in 1.22 */

/* ---- the tracing handler: forwards every call to the handler it wraps;
 * numpy's own Track/Untrack calls then attribute the blocks to it ---- */
typedef struct tracing {
    np_handler h;         /* first: numpy reads the capsule's pointer as this */
    const np_handler *inner;
    PyObject_ *inner_cap; /* keeps the inner handler alive */
} tracing;

static void *t_malloc(void *ctx, size_t n)
{
    const tracing *t = ctx;
    return t->inner->allocator.malloc(t->inner->allocator.ctx, n);
}

static void *t_calloc(void *ctx, size_t n, size_t sz)
{
    const tracing *t = ctx;
    return t->inner->allocator.calloc(t->inner->allocator.ctx, n, sz);
}

static void *t_realloc(void *ctx, void *p, size_t n)
{
    const tracing *t = ctx;
    return t->inner->allocator.realloc(t->inner->allocator.ctx, p, n);
}

static void t_free(void *ctx, void *p, size_t n)
{
    const tracing *t = ctx;
    t->inner->allocator.free(t->inner->allocator.ctx, p, n);
}

static void tracing_dtor(PyObject_ *cap)
{
    tracing *t = cs_py.Capsule_GetPointer(cap, "mem_handler");
    if (!t)
        return;
    forget(&t->h);
    cs_py.DecRef(t->inner_cap);
    free(t);
}

/* numpy's _ARRAY_API capsule has no name, so PyCapsule_Import refuses it:
 * read the attribute and the pointer as numpy's own import_array does.
 * numpy 2 moved the module to numpy._core (numpy.core is a shim that warns
 * on every attribute); numpy 1.x has only numpy.core. */
static PyObject_ *array_api_capsule(void)
{
    static const char *const mods[] = {"numpy._core._multiarray_umath",
                                       "numpy.core._multiarray_umath"};
    PyObject_ *cap = NULL;
    for (int i = 0; i < 2 && !cap; i++) {
        if (i) { /* drop the first name's error; the last one's stays set */
            PyObject_ *t, *v, *tb;
            cs_py.Err_Fetch(&t, &v, &tb);
            cs_py.DecRef(t);
            cs_py.DecRef(v);
            cs_py.DecRef(tb);
        }
        PyObject_ *mod = cs_py.Import_ImportModule(mods[i]);
        if (mod) {
            cap = cs_py.Object_GetAttrString(mod, "_ARRAY_API");
            cs_py.DecRef(mod);
        }
    }
    return cap;
}

static void **numpy_api(void)
{
    static void **api;
    if (api)
        return api;
    if (!cs_py.Import_ImportModule || !cs_py.Object_GetAttrString)
        return NULL;
    PyObject_ *cap = array_api_capsule();
    if (!cap)
        return NULL; /* the ImportError stays set */
    const char *name = cs_py.Capsule_GetName(cap);
    void **a = cs_py.Capsule_GetPointer(cap, name);
    cs_py.DecRef(cap); /* the table is static in numpy's module */
    if (!a)
        return NULL;
    unsigned (*feature)(void) = (unsigned (*)(void))a[API_FEATURE_VERSION];
    if (feature() < NPY_1_22_API_VERSION)
        return NULL;
    api = a;
    return api;
}

static void set_error(const char *msg)
{
    if (cs_py.Err_SetString && cs_py.Exc_RuntimeError)
        cs_py.Err_SetString(*cs_py.Exc_RuntimeError, msg);
}

PyObject_ *capsan_get_handler(void)
{
    void **api = numpy_api();
    if (!api) {
        set_error("capsan: numpy >= 1.22 with NEP 49 handlers is needed");
        return NULL;
    }
    return ((PyObject_ * (*)(void)) api[API_GET_HANDLER])();
}

PyObject_ *capsan_set_handler(PyObject_ *handler)
{
    void **api = numpy_api();
    if (!api) {
        set_error("capsan: numpy >= 1.22 with NEP 49 handlers is needed");
        return NULL;
    }
    return ((PyObject_ * (*)(PyObject_ *)) api[API_SET_HANDLER])(handler);
}

PyObject_ *capsan_handler_new(PyObject_ *inner)
{
    if (!cs_py.ok) {
        return NULL;
    }
    PyObject_ *icap = inner;
    if (icap)
        cs_py.IncRef(icap);
    else if (!(icap = capsan_get_handler()))
        return NULL;
    const np_handler *ih = cs_py.Capsule_GetPointer(icap, "mem_handler");
    if (!ih || validate("mem_handler", ih)) {
        cs_py.DecRef(icap);
        if (ih)
            set_error("capsan: the handler to wrap is not a valid version-1 PyDataMem_Handler");
        return NULL;
    }
    tracing *t = calloc(1, sizeof *t);
    if (!t) {
        cs_py.DecRef(icap);
        set_error("capsan: out of memory");
        return NULL;
    }
    snprintf(t->h.name, sizeof t->h.name, "capsan(%.100s)", ih->name);
    t->h.version = 1;
    t->h.allocator = (np_allocator){t, t_malloc, t_calloc, t_realloc, t_free};
    t->inner = ih;
    t->inner_cap = icap;
    PyObject_ *cap = cs_py.Capsule_New(t, "mem_handler", tracing_dtor);
    if (!cap) {
        cs_py.DecRef(icap);
        free(t);
        return NULL;
    }
    remember(&t->h);
    return cap;
}

static const tracing *tracing_of(PyObject_ *handler)
{
    return handler ? cs_py.Capsule_GetPointer(handler, "mem_handler") : NULL;
}

int capsan_handler_leaks(PyObject_ *handler)
{
    return capsan_handler_leaks_since(handler, 0, NULL, 0);
}

int capsan_handler_leaks_except(PyObject_ *handler, const uint64_t *held, size_t n)
{
    return capsan_handler_leaks_since(handler, 0, held, n);
}

int capsan_handler_leaks_since(PyObject_ *handler, uint64_t since_ns, const uint64_t *held,
                               size_t n)
{
    const tracing *t = tracing_of(handler);
    if (!t || !cs_lc)
        return 0;
    cs_young_flush();
    int r = cs_lc_report_live(cs_lc, CS_NS_NUMPY, (uint64_t)(uintptr_t)&t->h, since_ns, held, n);
    cs_findings_flush();
    return r;
}

size_t capsan_handler_live(PyObject_ *handler, uint64_t *out, size_t max)
{
    return capsan_handler_live_since(handler, 0, out, max);
}

size_t capsan_handler_live_since(PyObject_ *handler, uint64_t since_ns, uint64_t *out, size_t max)
{
    const tracing *t = tracing_of(handler);
    uint64_t *keys;
    if (!t || !cs_lc)
        return 0;
    cs_young_flush();
    size_t n = cs_lc_live_from(cs_lc, CS_NS_NUMPY, (uint64_t)(uintptr_t)&t->h, since_ns, &keys);
    if (out)
        memcpy(out, keys, (n < max ? n : max) * sizeof *keys);
    cs_free_clean(keys, n * sizeof *keys); /* a stale key in freed memory is a root at exit */
    return n;
}

int capsan_handler_set_device(PyObject_ *handler, int device_type)
{
    const np_handler *h = handler ? cs_py.Capsule_GetPointer(handler, "mem_handler") : NULL;
    if (!h)
        return -1;
    remember(h);
    hmu_lock();
    known *k = known_of(h);
    if (k) {
        k->device = device_type;
        if (device_type && device_type != 1)
            any_device = 1;
    }
    hmu_unlock();
    return k ? 0 : -1;
}
