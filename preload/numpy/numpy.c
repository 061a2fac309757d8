/* NumPy data memory (NEP 49): every allocation and free of array data, in
 * every thread, context and handler, and the handlers themselves.
 *
 * numpy reaches its handlers through its own API table, not by symbol, but
 * every data allocation ends in PyTraceMalloc_Track(389047, ptr, size) and
 * every free starts with PyTraceMalloc_Untrack(389047, ptr), even with
 * tracemalloc off (rulebook §0). Just before either, numpy reads the
 * handler with PyCapsule_GetPointer(mem_handler, "mem_handler"): capsule_get.c
 * notes that handler per thread, so each block is attributed to the handler
 * that really made or freed it. */
#include "numpy.h"
#include "dataguard.h"
#include "npwrap.h"

#include <dlfcn.h>
#include <link.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "dltensor.h"
#include "exitroots.h"
#include "libpath.h"
#include "options.h"
#include "plausible.h"
#include "pyapi.h"
#include "quarantine.h"
#include "runtime.h"
#include "spin.h"
#include "stack.h"
#include "young.h"
#include "growclean.h"

#define NPY_TRACE_DOMAIN 389047u
#define API_SET_HANDLER 304
#define API_GET_HANDLER 305
#define API_FEATURE_VERSION 211
#define NPY_1_22_API_VERSION 0xf /* NEP 49 handlers appeared in 1.22 */

/* NEP 49 layout, version 1 (numpy/ndarraytypes.h) */
typedef struct np_allocator {
    void *ctx;
    void *(*malloc)(void *ctx, size_t size);
    void *(*calloc)(void *ctx, size_t nelem, size_t elsize);
    void *(*realloc)(void *ctx, void *ptr, size_t new_size);
    void (*free)(void *ctx, void *ptr, size_t size);
} np_allocator;

typedef struct np_handler {
    char name[127];
    uint8_t version;
    np_allocator allocator;
} np_handler;
_Static_assert(sizeof(np_handler) == 168, "PyDataMem_Handler layout");

/* ---- the handlers seen so far, with a snapshot of each (R28: a
 * handler must be immortal, so any change means it is gone) ---- */
#define MAX_HANDLERS 256
typedef struct known {
    const np_handler *h;
    np_handler snap;
    int gone; /* its functions left the address space: never read it again */
    int device; /* DLPack device type it serves; 0 = plain host memory */
    int ctx_freed; /* free() was called on its ctx */
    int freed; /* free() was called on the struct itself: never read it again */
    size_t head; /* the bytes of snap that say which handler it is: its name
                  * up to its NUL, the NUL, then up to the allocator */
    /* a name of up to 24 bytes (head) as three words to compare: each
     * masked to the bytes that count, and snap's words so masked */
    uint64_t nm_mask[3], nm_want[3];
} known;

static known handlers[MAX_HANDLERS];
static int nhandlers;
static int any_device; /* some handler serves another device: check exports */
static cs_spin hmu = CS_SPIN_INIT;
/* odd while a section that may change an entry runs, bumped again after
 * it: staleness() reads an unchanged list without the lock */
static _Atomic unsigned handlers_gen;

static void hmu_lock(void)
{
    cs_spin_lock(&hmu);
    atomic_fetch_add_explicit(&handlers_gen, 1, memory_order_relaxed);
    atomic_thread_fence(memory_order_release);
}

static void hmu_unlock(void)
{
    atomic_fetch_add_explicit(&handlers_gen, 1, memory_order_release);
    cs_spin_unlock(&hmu);
}
/* the ctx pointers of known handlers, as bits of a 4096-bit filter: every
 * free() of the process tests one bit before taking hmu */
static _Atomic uint64_t ctx_bits[64];

static unsigned ctx_bit(uintptr_t p)
{
    return (unsigned)(((uint64_t)(p >> 4) * 0x9e3779b97f4a7c15ull) >> 52);
}

static void watch_ctx(const void *ctx)
{
    if (ctx) {
        unsigned b = ctx_bit((uintptr_t)ctx);
        if (!(atomic_fetch_or(&ctx_bits[b >> 6], 1ull << (b & 63)) & (1ull << (b & 63))))
            cs_ff_mark((uintptr_t)ctx); /* free() asks here only past the free() filter */
    }
}

/* where numpy's array_dealloc calls free() (see hook_free): the return
 * addresses of its free() calls, 0 until learned */
#define MAX_FREE_SITES 4
static _Atomic uintptr_t free_sites[MAX_FREE_SITES];
static int dealloc_known; /* learned, or given up: learn_dealloc stops */

__thread cs_np_cur_t cs_np_cur __attribute__((tls_model("initial-exec")));
#define cur_cap cs_np_cur.cap
#define cur_handler ((const np_handler *)cs_np_cur.handler)
#define cur_fresh cs_np_cur.fresh

static known *known_of(const np_handler *h)
{
    for (int i = 0; i < nhandlers; i++)
        if (handlers[i].h == h)
            return &handlers[i];
    return NULL;
}

/* R27: a handler numpy will call must be whole. */
static uint32_t validate(const char *capname, const np_handler *h)
{
    if (!capname || strcmp(capname, "mem_handler") != 0)
        return CS_BAD_HANDLER_NAME;
    if (!cs_plausible(h))
        return CS_BAD_HANDLER_NULL_FN;
    if (!memchr(h->name, 0, sizeof h->name))
        return CS_BAD_HANDLER_UNTERMINATED;
    if (h->version != 1)
        return CS_BAD_HANDLER_VERSION;
    if (!h->allocator.malloc || !h->allocator.calloc || !h->allocator.realloc ||
        !h->allocator.free)
        return CS_BAD_HANDLER_NULL_FN;
    return 0;
}

/* A handler's name as a string and its version: what a free compares
 * (the bytes after the name's NUL say nothing) */
static size_t head_of(const np_handler *h)
{
    return strnlen(h->name, sizeof h->name) + 1;
}

/* k->head and the words a free compares, from k->snap (the struct is 168
 * bytes: its first 24 can always be read) */
static void set_head(known *k)
{
    k->head = head_of(&k->snap);
    for (size_t w = 0; w < 3; w++) {
        size_t in = k->head > 8 * w ? k->head - 8 * w : 0;
        k->nm_mask[w] = in >= 8 ? ~0ull : in ? ~0ull >> (64 - 8 * in) : 0;
        uint64_t v;
        memcpy(&v, k->snap.name + 8 * w, 8);
        k->nm_want[w] = v & k->nm_mask[w];
    }
}

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

/* First sight of a handler: remember it as it is now. `refresh`: it is
 * being installed, so what is there now is the handler (an address may
 * be reused by a new handler after the old one was freed). */
static void remember_as(const np_handler *h, int refresh)
{
    hmu_lock();
    known *k = known_of(h);
    if (k && refresh && !k->gone) {
        memcpy(&k->snap, h, sizeof *h);
        set_head(k);
        k->ctx_freed = k->freed = 0;
        watch_ctx(h->allocator.ctx);
    } else if (!k && nhandlers < MAX_HANDLERS) {
        handlers[nhandlers].h = h;
        memcpy(&handlers[nhandlers].snap, h, sizeof *h);
        handlers[nhandlers].gone = 0;
        handlers[nhandlers].ctx_freed = 0;
        handlers[nhandlers].freed = 0;
        set_head(&handlers[nhandlers]);
        watch_ctx(h->allocator.ctx);
        watch_ctx(h); /* a heap handler's own free() (see note_ctx_free) */
        /* names that say what memory they hand out */
        handlers[nhandlers].device = strstr(h->name, "cuda_host") || strstr(h->name, "pinned")
                                         ? 3 /* kDLCUDAHost */
                                         : strstr(h->name, "cuda_managed") ? 13 : 0;
        if (handlers[nhandlers].device)
            any_device = 1;
        nhandlers++;
    }
    hmu_unlock();
}

static void remember(const np_handler *h) { remember_as(h, 0); }

static void forget(const np_handler *h)
{
    hmu_lock();
    known *k = known_of(h);
    if (k)
        *k = handlers[--nhandlers];
    hmu_unlock();
}

void cs_np_new_handler(const void *handler)
{
    cs_np_cur.handler = handler;
    if (handler && cs_plausible(handler))
        remember(handler);
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

void cs_np_check_export_device(const void *managed, int versioned)
{
    if (!any_device || !cs_lc) /* the usual case: no struct is read */
        return;
    uint64_t mt = (uint64_t)(uintptr_t)managed, data = cs_dl_data(managed);
    if (cs_dl_device_type(managed, versioned) != 1 /* kDLCPU */ || !data)
        return;
    cs_event origin;
    cs_young_adopt(data);
    cs_lc_lock(cs_lc, data);
    int found = cs_lc_origin(cs_lc, CS_NS_NUMPY, data, &origin) &&
                cs_lc_state(cs_lc, CS_NS_NUMPY, data) == CS_ST_CREATED;
    cs_lc_unlock(cs_lc, data);
    if (!found || !origin.c)
        return;
    int dev = 0;
    hmu_lock();
    known *k = known_of((const np_handler *)(uintptr_t)origin.c);
    if (k)
        dev = k->device;
    hmu_unlock();
    if (!dev || dev == 1)
        return;
    /* the finding shows the export (the struct's history) and where the
     * device memory was allocated (this event's stack) */
    cs_event ev = {.kind = CS_EV_DEVICE, .obj = mt, .b = data, .c = origin.c,
                   .aux = (uint16_t)dev, .stack = origin.stack};
    cs_emit(&ev, 0, NULL, NULL);
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

static void learn_dealloc(void);
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

/* ---- numpy's free() of an OWNDATA array's data that has no handler ----
 * array_dealloc, ndarray's tp_dealloc, frees such data with libc free():
 * one call site in numpy 1.24 to 2.5. numpy 1.24 read
 * NUMPY_WARN_IF_NO_MEM_POLICY with getenv() just before it; numpy 2 reads
 * a flag it set once at import, so the call site is what tells. It is
 * learned once numpy's module is in sys.modules (under the GIL): the
 * function numpy's ndarray type names as tp_dealloc (subclasses defined in
 * Python reach it through subtype_dealloc), its bounds from its unwind
 * info (libunwind, which unwind.c loaded), and in its code the calls that
 * go through the object's GOT slot for free() (patched to hook_np_free).
 * Only the call site itself counts: frees that array_dealloc's callees
 * reach by tail calls (the dimensions' PyMem_RawFree) share its return
 * addresses otherwise. */
#define TP_DEALLOC_OFFSET 48 /* offsetof(PyTypeObject, tp_dealloc): every 64-bit CPython 3 */

static void hook_free(void *p);
static void hook_np_free(void *p);

static int dealloc_bounds(uintptr_t fn, uintptr_t *lo, uintptr_t *hi)
{
    /* unw_proc_info_t starts with start_ip and end_ip; the rest is room */
    uint64_t pi[32] = {0};
    void *h = cs_libunwind_open(RTLD_NOW | RTLD_LOCAL | RTLD_NOLOAD);
    if (!h)
        return 0;
    int (*info)(void *, uint64_t, uint64_t *, void *) =
        (int (*)(void *, uint64_t, uint64_t *, void *))dlsym(h, "_ULx86_64_get_proc_info_by_ip");
    void **space = dlsym(h, "_ULx86_64_local_addr_space");
    int ok = info && space && *space && info(*space, fn, pi, NULL) == 0 && pi[0] <= fn &&
             fn < pi[1] && pi[1] - pi[0] < (1u << 16);
    dlclose(h);
    if (ok) {
        *lo = pi[0];
        *hi = pi[1];
    }
    return ok;
}

/* the loaded segments of the object that holds one address */
typedef struct segs {
    uintptr_t at;
    int n;
    uintptr_t lo[8], hi[8];
    int exec[8];
} segs;

static int segs_cb(struct dl_phdr_info *info, size_t size, void *data)
{
    (void)size;
    segs *s = data;
    int mine = 0;
    for (int i = 0; i < info->dlpi_phnum; i++) {
        const ElfW(Phdr) *ph = &info->dlpi_phdr[i];
        uintptr_t lo = info->dlpi_addr + ph->p_vaddr;
        if (ph->p_type == PT_LOAD && s->at >= lo && s->at < lo + ph->p_memsz)
            mine = 1;
    }
    if (!mine)
        return 0;
    for (int i = 0; i < info->dlpi_phnum && s->n < 8; i++) {
        const ElfW(Phdr) *ph = &info->dlpi_phdr[i];
        if (ph->p_type == PT_LOAD && (ph->p_flags & PF_R)) {
            s->lo[s->n] = info->dlpi_addr + ph->p_vaddr;
            s->hi[s->n] = s->lo[s->n] + ph->p_memsz;
            s->exec[s->n++] = !!(ph->p_flags & PF_X);
        }
    }
    return 1;
}

static int in_segs(const segs *s, uintptr_t a, size_t len, int exec)
{
    for (int i = 0; i < s->n; i++)
        if (a >= s->lo[i] && a + len <= s->hi[i] && (!exec || s->exec[i]))
            return 1;
    return 0;
}

/* A GOT slot of this object that calls free(): got.c patched it already
 * (free is hooked in every object). Never take free's own address here: a
 * non-PIE python's canonical PLT entry for free would then serve this
 * library's calls too, and that entry goes through a patched slot. */
static int free_slot(const segs *s, uintptr_t slot)
{
    return in_segs(s, slot, sizeof(uintptr_t), 0) &&
           (*(const uintptr_t *)slot == (uintptr_t)hook_np_free ||
            *(const uintptr_t *)slot == (uintptr_t)hook_free);
}

/* A PLT stub at t that jumps through a free() slot: [endbr64] [bnd] jmp *disp(%rip) */
static int free_stub(const segs *s, uintptr_t t)
{
    if (!in_segs(s, t, 16, 1))
        return 0;
    const uint8_t *c = (const uint8_t *)t;
    if (c[0] == 0xf3 && c[1] == 0x0f && c[2] == 0x1e && c[3] == 0xfa)
        c += 4;
    if (c[0] == 0xf2)
        c++;
    if (c[0] != 0xff || c[1] != 0x25)
        return 0;
    int32_t d;
    memcpy(&d, c + 2, 4);
    return free_slot(s, (uintptr_t)(c + 6) + (intptr_t)d);
}

/* Return addresses of the free() calls in [lo, hi): call rel32 to a free
 * stub, or call *disp(%rip) through a free slot (-fno-plt). A byte pattern
 * inside another instruction would have to decode to a call whose target
 * is that very stub: not checked further. */
static int find_free_calls(const segs *s, uintptr_t lo, uintptr_t hi, uintptr_t *out, int max)
{
    int n = 0;
    if (!in_segs(s, lo, hi - lo, 1))
        return 0;
    for (uintptr_t a = lo; a + 5 <= hi && n < max; a++) {
        const uint8_t *c = (const uint8_t *)a;
        int32_t d;
        if (c[0] == 0xe8) {
            memcpy(&d, c + 1, 4);
            if (free_stub(s, a + 5 + (intptr_t)d))
                out[n++] = a + 5;
        } else if (c[0] == 0xff && c[1] == 0x15 && a + 6 <= hi) {
            memcpy(&d, c + 2, 4);
            if (free_slot(s, a + 6 + (intptr_t)d))
                out[n++] = a + 6;
        }
    }
    return n;
}

/* numpy's C-API table, read as import_array does (the capsule's own
 * name: numpy 1.x leaves it NULL), for npwrap.c's constructor hooks */
static int wrap_api(PyObject_ *mod)
{
    PyObject_ *cap = cs_py.Object_GetAttrString(mod, "_ARRAY_API");
    if (!cap)
        return 0; /* the caller restores the error state */
    cs_npwrap_install(cs_py.Capsule_GetPointer(cap, cs_py.Capsule_GetName(cap)));
    cs_py.DecRef(cap); /* the table is static in numpy's module */
    return 1;
}

static void learn_dealloc(void)
{
    if (!cs_py.ok || !cs_py.Object_GetAttrString || !cs_py_has_gil())
        return;
    if (!cs_py.Import_GetModuleDict || !cs_py.Dict_GetItemString) {
        dealloc_known = 1;
        return;
    }
    PyObject_ *t, *v, *tb;
    cs_py.Err_Fetch(&t, &v, &tb); /* numpy may allocate with an exception set */
    /* numpy 2 keeps a numpy.core shim: the first name is the module */
    PyObject_ *mod = cs_py_module("numpy._core._multiarray_umath");
    if (!mod)
        mod = cs_py_module("numpy.core._multiarray_umath");
    /* numpy 2's multi-phase init puts the module in sys.modules before it
     * runs: until _ARRAY_API is there, learn again later */
    if (mod && !atomic_load_explicit(&free_sites[0], memory_order_relaxed)) {
        PyObject_ *type = cs_py.Object_GetAttrString(mod, "ndarray");
        uintptr_t fn = type ? *(const uintptr_t *)((const char *)type + TP_DEALLOC_OFFSET) : 0;
        uintptr_t lo, hi, sites[MAX_FREE_SITES];
        segs sg = {.at = fn};
        int n = 0;
        if (fn && dealloc_bounds(fn, &lo, &hi) && dl_iterate_phdr(segs_cb, &sg))
            n = find_free_calls(&sg, lo, hi, sites, MAX_FREE_SITES);
        for (int i = 0; i < n; i++)
            atomic_store_explicit(&free_sites[i], sites[i], memory_order_release);
        if (type)
            cs_py.DecRef(type);
        if (cs_opt.verbosity && (n || type))
            dprintf(2, "==%d==capsan: numpy's array_dealloc: %d free() call(s)%s\n", (int)getpid(),
                    n, n ? "" : ": numpy-foreign-free is off");
        if (!n && type)
            atomic_store(&free_sites[0], 1); /* no free() call: never a site */
    }
    if (mod && wrap_api(mod)) {
        dealloc_known = 1; /* numpy is imported: never again */
        cs_exitroots_arm(); /* what daemon threads hold at exit */
    }
    cs_py.Err_Restore(t, v, tb);
}

static inline int is_free_site(uintptr_t site)
{
    for (int i = 0; i < MAX_FREE_SITES; i++) {
        uintptr_t s = atomic_load_explicit(&free_sites[i], memory_order_relaxed);
        if (s == site)
            return 1;
        if (!s)
            return 0;
    }
    return 0;
}

/* free() of a known handler's ctx: its blocks can no longer be freed
 * through it safely (the handler functions still read the ctx); free() of
 * the handler struct itself: it is stale, and is not read again (ASan
 * saw staleness() compare the freed bytes) */
static void note_ctx_free(uintptr_t p)
{
    hmu_lock();
    for (int i = 0; i < nhandlers; i++) {
        if ((uintptr_t)handlers[i].snap.allocator.ctx == p && !handlers[i].gone)
            handlers[i].ctx_freed = 1;
        if ((uintptr_t)handlers[i].h == p)
            handlers[i].freed = 1;
    }
    hmu_unlock();
}

/* Every free() of every patched object: the checks that concern any
 * block, a few loads each. */
/* past the free() filter: a consumed tensor's data, a handler's ctx */
static __attribute__((noinline)) void free_watched(uintptr_t a)
{
    cs_dg_check_slow(a, CS_FREED_LIBC); /* a consumed tensor's data (dataguard.c) */
    unsigned b = ctx_bit(a);
    /* free(NULL) frees nothing: a handler whose ctx is NULL (numpy's
     * default) is not stale because another ctx shares NULL's filter bit */
    if ((atomic_load_explicit(&ctx_bits[b >> 6], memory_order_relaxed) & (1ull << (b & 63))) && a)
        note_ctx_free(a);
}

static inline __attribute__((always_inline)) int free_checks(void *p)
{
    uintptr_t a = (uintptr_t)p;
    cs_frees++;
    if (cs_ff_hit(a))
        free_watched(a);
    /* a released managed struct: its free waits (quarantine.c) */
    return cs_qr_take(p, CS_FREED_LIBC);
}

static void hook_free(void *p)
{
    if (!free_checks(p))
        free(p);
}

/* numpy's own free() calls: array_dealloc's sites free an array's data
 * when no handler does (a foreign block given OWNDATA); the other objects'
 * frees never come from there */
static void hook_np_free(void *p)
{
    if (__builtin_expect(is_free_site((uintptr_t)__builtin_return_address(0)), 0) && p &&
        cs_recording) {
        cs_event w, ev = {.kind = CS_EV_NP_FOREIGN_FREE, .obj = (uint64_t)(uintptr_t)p};
        cs_young_adopt((uint64_t)(uintptr_t)p); /* a block a handler gave, still young */
        if (cs_npwrap_find((uintptr_t)p, &w)) /* the line that made an array around it */
            cs_emit(&w, 0, NULL, NULL);
        cs_emit(&ev, 1, NULL, NULL); /* reported before a bad free can abort */
    }
    if (!free_checks(p))
        free(p);
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
