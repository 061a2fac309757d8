/* NumPy data memory (NEP 49): every allocation and free of array data, in
 * every thread, context and handler, and the handlers themselves.
 *
 * numpy reaches its handlers through its own API table, not by symbol, but
 * every data allocation ends in PyTraceMalloc_Track(389047, ptr, size) and
 * every free starts with PyTraceMalloc_Untrack(389047, ptr), even with
 * tracemalloc off (rulebook §0). Just before either, numpy reads the
 * handler with PyCapsule_GetPointer(mem_handler, "mem_handler"): capsule_get.c
 * notes that handler per thread, so each block is attributed to the handler
 * that really made or freed it. This file: those Track/Untrack hooks and
 * the checks of the handler each block goes through, numpy's ContextVar
 * hooks (a handler installed), the seam's hook table, dlclose. The handlers seen
 * are handlers.c's, the free() hooks free_hooks.c's, capsan.handler()
 * tracing_handler.c's. */
#include "numpy_int.h"

#include <dlfcn.h>
#include <string.h>

#include "plausible.h"
#include "pyapi.h"
#include "runtime.h"
#include "spin.h"
#include "stack.h"

#define NPY_TRACE_DOMAIN 389047u

#define cur_cap cs_np_cur.cap
#define cur_handler ((const np_handler *)cs_np_cur.handler)
#define cur_fresh cs_np_cur.fresh

/* h's name is not k's (R28: a changed handler) */
static inline __attribute__((always_inline)) int name_changed(const known *k, const np_handler *h)
{
    if (__builtin_expect(k->head > 24, 0))
        return memcmp(k->snap.name, h->name, k->head < sizeof h->name ? k->head : sizeof h->name);
    uint64_t v[3];
    memcpy(v, h->name, sizeof v);
    return (((v[0] & k->nm_mask[0]) ^ k->nm_want[0]) | ((v[1] & k->nm_mask[1]) ^ k->nm_want[1]) |
            ((v[2] & k->nm_mask[2]) ^ k->nm_want[2])) != 0;
}

/* The allocator's ctx and four functions as one nonzero 32-bit value:
 * a block must be freed through the ctx and functions that allocated it
 * (R28), whatever the handler was re-pointed to in place meanwhile. The
 * lifecycle compares a block's value at its alloc and at its free. */
static uint32_t allocator_fp(const np_handler *h)
{
    const uint64_t *w = (const uint64_t *)&h->allocator;
    uint64_t x = 0x9e3779b97f4a7c15ull;
    for (int i = 0; i < 5; i++)
        x = (x ^ w[i]) * 0xff51afd7ed558ccdull;
    return (uint32_t)(x >> 32) | 1;
}

/* the last handler an alloc went through on this thread, its allocator's
 * words as they were then (a loop allocates through the same one: five
 * compares, no hash) and their value */
static __thread struct { /* one thread-local struct: one GOT load reaches it all */
    const np_handler *h;
    uint64_t words[5];
    uint32_t last;
} fp_c __attribute__((tls_model("initial-exec")));

/* h is the handler the last alloc went through, its allocator unchanged */
static inline int fp_known(const np_handler *h)
{
    _Static_assert(sizeof h->allocator == sizeof fp_c.words, "ctx and four functions");
    const uint64_t *w = (const uint64_t *)&h->allocator;
    const uint64_t *c = fp_c.words;
    return h == fp_c.h &&
           !((w[0] ^ c[0]) | (w[1] ^ c[1]) | (w[2] ^ c[2]) | (w[3] ^ c[3]) | (w[4] ^ c[4]));
}

/* h's allocator value for a free: the last alloc's while unchanged */
static inline uint32_t free_fp(const np_handler *h)
{
    return __builtin_expect(fp_known(h), 1) ? fp_c.last : allocator_fp(h);
}

/* An alloc through h, which numpy just read: its allocator's value. A
 * handler re-pointed in place now allocates through its new ctx: watch
 * that ctx's free() from now on (note_ctx_free). */
static uint32_t alloc_state(const np_handler *h)
{
    if (__builtin_expect(fp_known(h), 1))
        return fp_c.last;
    uint32_t fp = allocator_fp(h);
    fp_c.h = h;
    fp_c.last = fp;
    memcpy(fp_c.words, &h->allocator, sizeof fp_c.words);
    hmu_lock();
    known *k = known_of(h);
    if (k && !k->gone && !k->freed &&
        memcmp(&k->snap.allocator, &h->allocator, sizeof h->allocator) != 0) {
        if (k->snap.allocator.ctx != h->allocator.ctx) {
            k->ctx_freed = 0;
            watch_ctx(h->allocator.ctx);
        }
        k->snap.allocator = h->allocator;
    }
    hmu_unlock();
    return fp;
}

/* Is the handler freeing a block still whole: loaded, not freed, its
 * name and version as first seen, its ctx not freed? (Its ctx and
 * functions are judged per block: allocator_fp.) */
static inline __attribute__((always_inline)) uint32_t staleness_locked(const np_handler *h,
                                                                      known **kp)
{
    uint32_t why = 0;
    known *k = *kp;
    if (k && k->gone)
        why = CS_STALE_UNLOADED;
    else if (k && k->freed) /* reading it would be a use-after-free */
        why = CS_STALE_CHANGED;
    else if (k && (k->snap.version != h->version || name_changed(k, h)))
        why = CS_STALE_CHANGED;
    else if (k && k->ctx_freed)
        why = CS_STALE_CTX_FREED;
    return why;
}

/* the handler the last free on this thread went through, its entry, and
 * the generation of the handler list it was looked up in */
static __thread struct {
    const np_handler *h;
    known *k;
    unsigned gen;
} st_c __attribute__((tls_model("initial-exec")));

/* inlined: every NumPy free asks (a call of its own cost W1 ~150 an iteration) */
static inline __attribute__((always_inline)) uint32_t staleness(const np_handler *h)
{
    if (!h)
        return 0;
    /* the same handler as this thread's last free, and no entry changed
     * since (checked again after reading it): no lock, no lookup */
    unsigned g = atomic_load_explicit(&handlers_gen, memory_order_acquire);
    if (h == st_c.h && g == st_c.gen && !(g & 1)) {
        uint32_t why = staleness_locked(h, &st_c.k);
        atomic_thread_fence(memory_order_acquire);
        if (atomic_load_explicit(&handlers_gen, memory_order_relaxed) == g)
            return why;
    }
    cs_spin_lock(&hmu);
    known *k = known_of(h);
    uint32_t why = staleness_locked(h, &k);
    st_c.h = h;
    st_c.k = k;
    st_c.gen = atomic_load_explicit(&handlers_gen, memory_order_relaxed);
    cs_spin_unlock(&hmu);
    return why;
}

void cs_np_after_dlclose(void)
{
    /* a handler whose free function was unloaded must not be read again:
     * its struct may have gone with the object */
    hmu_lock();
    for (int i = 0; i < nhandlers; i++) {
        Dl_info di;
        if (!handlers[i].gone && !dladdr((void *)(uintptr_t)handlers[i].snap.allocator.free, &di))
            handlers[i].gone = 1;
    }
    hmu_unlock();
    /* numpy itself unloaded (never in practice): learn it again if it
     * comes back */
    Dl_info di;
    uintptr_t site = atomic_load(&free_sites[0]);
    if (site && !dladdr((void *)site, &di)) {
        for (int i = 0; i < MAX_FREE_SITES; i++)
            atomic_store(&free_sites[i], 0);
        dealloc_known = 0;
    }
}

/* ---- hooks ---- */

static PyObject_ *numpy_allocator_var; /* numpy's "current_allocator" */

/* The handler numpy read for this Track/Untrack, or NULL (legacy path).
 * A realloc is GetPointer, Untrack(old), realloc, Track(new) (numpy 2.5:
 * GetPointer, realloc, Untrack, Track): a Track whose call site lies just
 * after the Untrack's belongs to the same call. Return addresses measured
 * in PyDataMem_UserRENEW: 16 bytes apart in numpy 1.24, 38 in 2.2 and 2.4
 * (the handler's realloc is called between them), 21 in 2.5. The nearest
 * Track of another function lies 70 bytes past an Untrack (2.4's legacy
 * PyDataMem_FREE, then PyDataMem_RENEW's Track; both without a handler). */
#define RENEW_SPAN 64
static __thread struct {
    uintptr_t site;
    const np_handler *h;
    const void *cap;
} renew_c __attribute__((tls_model("initial-exec")));

static const np_handler *take_handler(const void **cap, uintptr_t site, int is_track,
                                      unsigned *gil)
{
    const np_handler *h = NULL;
    *cap = NULL;
    *gil = 0;
    if (cur_fresh) {
        h = cur_handler;
        *cap = cur_cap;
        *gil = cs_np_cur.gil;
    } else if (is_track && site - renew_c.site - 1 < RENEW_SPAN) {
        h = renew_c.h;
        *cap = renew_c.cap;
    }
    cur_fresh = 0;
    renew_c.site = is_track ? 0 : site;
    renew_c.h = h;
    renew_c.cap = *cap;
    return h;
}

/* A handler call's GIL: held if the handler's read just before found it
 * held (take_handler), else asked */
static inline uint8_t handler_gil(unsigned read_gil, const void *site)
{
    if (read_gil == (CS_EVF_GIL_KNOWN | CS_EVF_GIL))
        return (uint8_t)read_gil;
    return (uint8_t)cs_check_gil(site, CS_NOGIL_HANDLER);
}

static unsigned learn_tries;
/* on the NEP 49 channel: until numpy is imported (a dict lookup a try) */
#define MAYBE_LEARN()                                                                   \
    do {                                                                                \
        if (__builtin_expect(!dealloc_known, 0) && (learn_tries++ & 15) == 0)           \
            learn_dealloc();                                                            \
    } while (0)

static int hook_track(unsigned int domain, uintptr_t ptr, size_t size)
{
    if (domain == NPY_TRACE_DOMAIN) {
        MAYBE_LEARN();
        const void *cap;
        unsigned read_gil;
        const np_handler *h =
            take_handler(&cap, (uintptr_t)__builtin_return_address(0), 1, &read_gil);
        if (ptr && cs_recording) {
            /* the legacy PyDataMem_NEW may run without the GIL; the
             * answer goes on to the event (one check per call) */
            uint8_t g = h ? handler_gil(read_gil, __builtin_return_address(0)) : 0;
            cs_event ev = {.kind = CS_EV_NP_ALLOC, .obj = ptr, .a = size, .flags = g,
                           .b = (uint64_t)(uintptr_t)cap, .c = (uint64_t)(uintptr_t)h,
                           .extra = h ? alloc_state(h) : 0};
            CS_STACK_HINT();
            cs_emit_np(&ev);
        }
    }
    return cs_py.TraceMalloc_Track(domain, ptr, size);
}

static inline __attribute__((always_inline)) int untrack(unsigned int domain, uintptr_t ptr,
                                                         const void *site)
{
    if (domain == NPY_TRACE_DOMAIN) {
        MAYBE_LEARN();
        const void *cap;
        unsigned read_gil;
        const np_handler *h = take_handler(&cap, (uintptr_t)site, 0, &read_gil);
        if (ptr && cs_recording) {
            uint8_t g = h ? handler_gil(read_gil, site) : 0;
            uint32_t why = staleness(h);
            /* a struct gone or freed is not read */
            uint32_t fp = h && why != CS_STALE_UNLOADED && why != CS_STALE_CHANGED ? free_fp(h) : 0;
            cs_event ev = {.kind = CS_EV_NP_FREE, .obj = ptr, .flags = g, .a = fp,
                           .b = (uint64_t)(uintptr_t)cap, .c = (uint64_t)(uintptr_t)h,
                           .extra = why};
            cs_emit_np(&ev);
        }
    }
    return cs_py.TraceMalloc_Untrack(domain, ptr);
}

static int hook_untrack(unsigned int domain, uintptr_t ptr)
{
    return untrack(domain, ptr, __builtin_return_address(0));
}

/* numpy's own module. numpy 2.5 asks whether tracemalloc is tracing with
 * Untrack's answer (-2: it is not) and then skips the Track of what it
 * allocates without a handler (PyDataMem_NEW, its small-block cache) and
 * of a block a handler reallocated: with tracemalloc off, capsan would see
 * those blocks freed but never made, and a block realloc'd in place freed
 * twice. capsan is tracing numpy's domain, so numpy hears 0 (as with
 * tracemalloc on). Its Track calls then reach the interpreter, which
 * answers -2, and numpy only checks Track for -1. Earlier numpy ignores
 * Untrack's answer. */
static int hook_np_untrack(unsigned int domain, uintptr_t ptr)
{
    int r = untrack(domain, ptr, __builtin_return_address(0));
    return r == -2 && cs_recording ? 0 : r;
}

static PyObject_ *hook_cv_new(const char *name, PyObject_ *def)
{
    PyObject_ *v = cs_py.ContextVar_New(name, def);
    if (v && name && !strcmp(name, "current_allocator"))
        numpy_allocator_var = v;
    return v;
}

/* numpy made its ContextVar before capsan started (import capsan after
 * numpy): recognise it by name at its first Set. GIL held. */
static int is_numpy_allocator_var(PyObject_ *var)
{
    if (numpy_allocator_var)
        return var == numpy_allocator_var;
    if (!cs_py.Object_GetAttrString || !var)
        return 0;
    PyObject_ *t, *v, *tb;
    cs_py.Err_Fetch(&t, &v, &tb);
    PyObject_ *name = cs_py.Object_GetAttrString(var, "name");
    const char *s = name ? cs_py.Unicode_AsUTF8(name) : NULL;
    int match = s && !strcmp(s, "current_allocator");
    if (name)
        cs_py.DecRef(name);
    cs_py.Err_Restore(t, v, tb); /* a pending exception survives (R5) */
    if (match)
        numpy_allocator_var = var;
    return match;
}

static int hook_cv_set(PyObject_ *var, PyObject_ *value)
{
    if (var && value && cs_recording && is_numpy_allocator_var(var)) {
        if (!dealloc_known) /* capsan started after numpy: maybe no Track yet */
            learn_dealloc();
        /* PyDataMem_SetHandler: check the handler before numpy uses it;
         * numpy 1.24 takes a misnamed capsule and fails later (R27) */
        const char *name = cs_py.Capsule_GetName(value);
        const np_handler *h = NULL;
        if (name) {
            h = cs_py.Capsule_GetPointer(value, name);
        } else {
            PyObject_ *t, *v, *tb;
            cs_py.Err_Fetch(&t, &v, &tb); /* not a capsule at all */
            cs_py.Err_Restore(t, v, tb);
        }
        uint32_t bad = validate(name, h);
        if (h && cs_plausible(h) && !bad)
            remember_as(h, 1);
        if (bad) {
            cs_event ev = {.kind = CS_EV_NP_HANDLER, .obj = (uint64_t)(uintptr_t)h,
                           .a = (uint64_t)(uintptr_t)value, .extra = bad,
                           .b = h && cs_plausible(h) ? h->version : 0};
            cs_emit(&ev, 1, NULL, NULL);
        }
    }
    return cs_py.ContextVar_Set(var, value);
}

#define NUMPY_MODULE "_multiarray_umath"

/* a hook with a module (only_in) wins over the same name's general one */
const cs_hook cs_numpy_hooks[] = {
    {"PyTraceMalloc_Track", (void *)hook_track, NULL},
    {"PyTraceMalloc_Untrack", (void *)hook_np_untrack, NUMPY_MODULE},
    {"PyTraceMalloc_Untrack", (void *)hook_untrack, NULL},
    {"PyContextVar_New", (void *)hook_cv_new, NULL},
    {"PyContextVar_Set", (void *)hook_cv_set, NULL},
    {"free", (void *)hook_np_free, NUMPY_MODULE},
    {"free", (void *)hook_free, NULL},
};
const int cs_numpy_nhooks = sizeof cs_numpy_hooks / sizeof cs_numpy_hooks[0];

int cs_numpy_init(void)
{
    return cs_py.TraceMalloc_Track && cs_py.TraceMalloc_Untrack && cs_py.ContextVar_New &&
           cs_py.ContextVar_Set;
}
