/* PyCapsule hooks and DLPack trampolines (see capsule.h).
 *
 * Most capsule traffic is not DLPack (import torch alone makes thousands
 * of capsules): each hook decides by the name's first letter before doing
 * anything else. */
#include "capsule.h"

#include <dlfcn.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "arrow.h"
#include "capsan.h"
#include "deleter.h"
#include "dltensor.h"
#include "numpy.h"
#include "spin.h"
#include "options.h"
#include "probe.h"
#include "pyapi.h"
#include "names.h"
#include "runtime.h"
#include "stack.h"
#include "xapi.h"
#include "young.h"

/* ---- reading a capsule ----
 * PyCapsule has kept one layout since 3.1 (PyObject_HEAD, pointer, name,
 * context, destructor). It is read directly once the first capsule capsan
 * makes has shown that layout; until then, and if it ever does not, the
 * C-API is asked (which costs calls and a strcmp per read). */
typedef struct capsule_obj {
    intptr_t refcnt;
    const void *type;
    void *pointer;
    const char *name;
    void *context;
    cs_capsule_dtor destructor;
} capsule_obj;

static const void *capsule_type; /* set once the layout is confirmed */

static void learn_layout(PyObject_ *cap, void *ptr, const char *name, cs_capsule_dtor d)
{
    const capsule_obj *c = (const capsule_obj *)cap;
    if (!capsule_type && c->pointer == ptr && c->name == name && c->destructor == d &&
        c->pointer == cs_py.Capsule_GetPointer(cap, name) && cs_py.Capsule_GetName(cap) == name)
        __atomic_store_n(&capsule_type, c->type, __ATOMIC_RELEASE);
}

/* cap's fields if it is a capsule of the known layout, else 0 */
static inline const capsule_obj *direct(PyObject_ *cap)
{
    const void *t = __atomic_load_n(&capsule_type, __ATOMIC_ACQUIRE);
    const capsule_obj *c = (const capsule_obj *)cap;
    return t && c && c->type == t ? c : NULL;
}

static inline __attribute__((always_inline)) cs_capsule_dtor cap_destructor(PyObject_ *cap)
{
    const capsule_obj *c = direct(cap);
    return c ? c->destructor : cs_py.Capsule_GetDestructor(cap);
}

static inline __attribute__((always_inline)) const char *cap_name(PyObject_ *cap)
{
    const capsule_obj *c = direct(cap);
    return c ? c->name : cs_py.Capsule_GetName(cap);
}

static inline __attribute__((always_inline)) void *cap_pointer(PyObject_ *cap, const char *name)
{
    const capsule_obj *c = direct(cap);
    return c ? c->pointer : cs_py.Capsule_GetPointer(cap, name);
}

/* ---- destructor stubs: one per original destructor ----
 * An exported capsule gets stub k as its destructor, where dtors[k] is the
 * producer's own: the stub knows what to forward to without a table keyed
 * by capsule. Producers bring few distinct destructors (numpy's, torch's);
 * past NSTUBS a capsule keeps its own destructor and its death is not
 * seen. Each stub is 16 bytes: endbr64; mov $k, %esi; jmp to the shared
 * body, which gets (capsule, k). Arrow capsules get the 64 stubs that
 * follow, whose body is Arrow's (cs_ar_capsule_dtor_body): one range
 * check still tells a stub of capsan's, and the DLPack body knows nothing
 * of Arrow. */
#define NSTUBS 64
/* (the bodies are `used`: only the stubs' asm calls them, and the link
 * time optimizer sees no asm) */
void cs_capsule_dtor_body(PyObject_ *cap, unsigned k);
void cs_ar_capsule_dtor_body(PyObject_ *cap, unsigned k);
extern const char cs_dtor_stubs[] __attribute__((visibility("hidden")));
#define CS_STUBS(body)                 \
    ".set .Lcs_k, 0\n"                 \
    ".rept 64\n"                       \
    "  .p2align 4\n"                   \
    "  endbr64\n"                      \
    "  movl $.Lcs_k, %esi\n"           \
    "  jmp " body "\n"                 \
    "  .set .Lcs_k, .Lcs_k + 1\n"      \
    ".endr\n"
__asm__(".text\n"
        ".p2align 4\n"
        ".globl cs_dtor_stubs\n" /* global: LTO may put its users in another partition */
        ".hidden cs_dtor_stubs\n"
        "cs_dtor_stubs:\n"
        CS_STUBS("cs_capsule_dtor_body")
        CS_STUBS("cs_ar_capsule_dtor_body"));

static cs_capsule_dtor dtors[NSTUBS];
static _Atomic unsigned ndtors;
static cs_spin dtors_mu = CS_SPIN_INIT;

static inline cs_capsule_dtor stub(unsigned k)
{
    return (cs_capsule_dtor)(uintptr_t)(cs_dtor_stubs + 16 * k);
}

/* Arrow's stub k */
static inline cs_capsule_dtor ar_stub(unsigned k) { return stub(NSTUBS + k); }

/* k if d is stub k (DLPack's or Arrow's), else -1 */
static inline int stub_index(cs_capsule_dtor d)
{
    uintptr_t off = (uintptr_t)d - (uintptr_t)cs_dtor_stubs;
    return off < 2 * 16 * NSTUBS && !(off & 15) ? (int)(off / 16) % NSTUBS : -1;
}

static inline int is_ar_stub(cs_capsule_dtor d)
{
    return (uintptr_t)d - (uintptr_t)cs_dtor_stubs - 16 * NSTUBS < 16 * NSTUBS;
}

/* The stub that forwards to d (NULL included); -1 when all are taken. */
static int stub_for(cs_capsule_dtor d)
{
    unsigned n = atomic_load_explicit(&ndtors, memory_order_acquire);
    for (unsigned k = 0; k < n; k++)
        if (dtors[k] == d)
            return (int)k;
    cs_spin_lock(&dtors_mu);
    n = atomic_load_explicit(&ndtors, memory_order_relaxed);
    int k = -1;
    for (unsigned i = 0; i < n && k < 0; i++)
        if (dtors[i] == d)
            k = (int)i;
    if (k < 0 && n < NSTUBS) {
        dtors[n] = d;
        atomic_store_explicit(&ndtors, n + 1, memory_order_release);
        k = (int)n;
    }
    cs_spin_unlock(&dtors_mu);
    return k;
}

/* the producer's destructor behind one of ours, or d itself */
static cs_capsule_dtor unwrap(cs_capsule_dtor d)
{
    int k = stub_index(d);
    return k >= 0 ? dtors[k] : d;
}

/* ---- trampolines ---- */

static int in_dtor_of(const void *cap)
{
    cs_thread *t = cs_thread_get();
    return t && t->dtor_capsule == cap;
}

/* The capsule whose running destructor took its pointer under the
 * unconsumed name (hook_GetPointer): a destructor that then releases the
 * tensor without going through the deleter field (JAX's calls its deleter
 * function directly) did release it. */
static __thread const void *dtor_took __attribute__((tls_model("initial-exec")));

/* A capsule that still holds a tensor is dying, and that tensor was
 * released already: a consumer deleted without renaming (the producer's
 * destructor is about to delete again), or a producer's destructor released
 * a consumed tensor (numpy's owner capsule is about to). That destructor
 * reads the deleter out of a struct that may be freed and reused, so the
 * trampoline may never see the call: it is judged here, before it runs.
 * Returns 1 when protect=1 says the destructor must not run. Only looked
 * up once something was released out of turn. */
static int judge_redelete(cs_thread *t, PyObject_ *cap, void *mt)
{
    if (!t || !mt || !cs_recording ||
        (!cs_findings_judged() && !atomic_load_explicit(&cs_dl_unconsumed_released, memory_order_relaxed)))
        return 0;
    cs_young_dl_adopt((uint64_t)(uintptr_t)mt);
    cs_lc_lock(cs_lc, (uint64_t)(uintptr_t)mt);
    int st = cs_lc_state(cs_lc, CS_NS_DLPACK, (uint64_t)(uintptr_t)mt);
    cs_lc_unlock(cs_lc, (uint64_t)(uintptr_t)mt);
    if (st != CS_ST_RELEASED)
        return 0;
    cs_event ev = {.kind = CS_EV_DELETE, .obj = (uint64_t)(uintptr_t)mt,
                   .a = (uint64_t)(uintptr_t)cap, .flags = CS_EVF_IN_DTOR};
    cs_event origin;
    int found = 0;
    unsigned v = cs_emit(&ev, 1, &origin, &found);
    if (v & CS_VERDICT_SKIP)
        return 1;
    t->predicted = mt;
    t->predicted_fn = found && origin.kind == CS_EV_EXPORT ? (void *)(uintptr_t)origin.b : NULL;
    return 0;
}

/* Stub k's body: the capsule is dying (capsule_dealloc); run the
 * producer's destructor dtors[k], then tell the lifecycle. */
/* the capsule whose destructor this thread found re-entered (said once) */
static __thread const void *reentered __attribute__((tls_model("initial-exec")));

static void reentry_event(PyObject_ *cap, void *mt)
{
    cs_event ev = {.kind = CS_EV_DESTROY, .obj = (uint64_t)(uintptr_t)mt,
                   .a = (uint64_t)(uintptr_t)cap, .aux = CS_NAME_OTHER,
                   .extra = CS_DESTROY_REENTERED};
    cs_emit(&ev, 1, NULL, NULL);
}

/* An Arrow capsule dying: its struct is judged around the producer's
 * destructor (arrow.c); the name may have been changed (R40) */
static void arrow_dtor(PyObject_ *cap, cs_capsule_dtor orig, cs_thread *t, void *ptr)
{
    cs_ar_dying d;
    cs_ar_dtor_enter(cap, ptr, orig != NULL, &d);
    void *saved = t ? t->dtor_capsule : NULL, *saved_mt = t ? t->dtor_mt : NULL;
    if (t)
        t->dtor_capsule = cap, t->dtor_mt = ptr;
    if (orig)
        orig(cap);
    if (t)
        t->dtor_capsule = saved, t->dtor_mt = saved_mt;
    const capsule_obj *dc = direct(cap);
    if (dc)
        ((capsule_obj *)dc)->pointer = NULL;
    cs_ar_dtor_exit(cap, &d);
}

/* Arrow's stub k's body: an Arrow capsule is dying, whatever its name now */
__attribute__((used)) void cs_ar_capsule_dtor_body(PyObject_ *cap, unsigned k)
{
    cs_capsule_dtor orig = k < NSTUBS ? dtors[k] : NULL;
    arrow_dtor(cap, orig, cs_thread_get(), cap_pointer(cap, cap_name(cap)));
}

__attribute__((used)) void cs_capsule_dtor_body(PyObject_ *cap, unsigned k)
{
    cs_capsule_dtor orig = k < NSTUBS ? dtors[k] : NULL;
    cs_thread *t = cs_thread_get();
    const char *name = cap_name(cap);
    int nk = name_kind(name);
    void *mt = cap_pointer(cap, name);
    if (t && t->dtor_capsule == cap && cs_recording && reentered != cap) {
        /* R4: the destructor resurrected the capsule it is destroying and
         * it dies again inside itself: a recursion that ends in SIGSEGV.
         * Said at the first re-entry (PyErr_WriteUnraisable(self), the
         * usual way in, is caught before it: hook_WriteUnraisable) */
        reentered = cap;
        reentry_event(cap, mt);
    }
    void *saved = t ? t->dtor_capsule : NULL, *saved_mt = t ? t->dtor_mt : NULL;
    void *saved_pred = t ? t->predicted : NULL, *saved_fn = t ? t->predicted_fn : NULL;
    const void *saved_took = dtor_took;
    dtor_took = NULL;
    int skip = orig && nk != NK_USED && nk != NK_USEDV && judge_redelete(t, cap, mt);
    if (t)
        t->dtor_capsule = cap, t->dtor_mt = mt;
    if (orig && !skip) {
        int err_gil = cs_recording && cs_py.ok && cs_py_live() && cs_gil_held();
        PyObject_ *err = cs_dl_err_before(err_gil);
        orig(cap);
        if (nk != NK_NPDL)
            cs_dl_err_after(err_gil, err, mt, cap);
    }
    /* the capsule is freed next, and nothing reads its pointer after the
     * destructor: a stale copy in freed memory would make the tensor look
     * referenced to the reachability scan at _exit (reach.c) */
    const capsule_obj *dc = direct(cap);
    if (dc)
        ((capsule_obj *)dc)->pointer = NULL;
    if (t) {
        t->dtor_capsule = saved;
        t->dtor_mt = saved_mt;
        t->predicted = saved_pred;
        t->predicted_fn = saved_fn;
    }
    if (nk == NK_NPDL)
        return; /* numpy's owner capsule: its life is its array's */
    int took = t && dtor_took == cap;
    dtor_took = saved_took;
    if (reentered == cap) {
        if (saved == cap)
            return; /* a re-entered call: the outermost one says how it died */
        reentered = NULL;
    }
    if (!cs_recording)
        return;
    cs_event ev = {.kind = CS_EV_DESTROY, .obj = (uint64_t)(uintptr_t)mt,
                   .a = (uint64_t)(uintptr_t)cap,
                   .aux = (uint16_t)(nk == NK_DL || nk == NK_DLV     ? CS_NAME_UNCONSUMED
                                     : nk == NK_USED || nk == NK_USEDV ? CS_NAME_USED
                                                                       : CS_NAME_OTHER),
                   .extra = (orig ? 0 : CS_DESTROY_NO_DTOR) | (took ? CS_DESTROY_TOOK : 0)};
    /* the death of a consumed capsule is the normal case: the consume
     * already moved its tensor on, and no finding depends on it */
    if (ev.aux != CS_NAME_USED) {
        CS_STACK_HINT(); /* reached by a jmp from stub k: its caller's slot */
        cs_emit(&ev, 1, NULL, NULL);
    }
}

/* ---- hooks ---- */

/* A capsule's tensor, lent: wrapped and born, and (numpy) checked for
 * memory of another device exported as CPU */
static void export(void *mt, PyObject_ *cap, int versioned, uint8_t gil_flags)
{
    if (cs_dl_lend(mt, (uint64_t)(uintptr_t)cap, versioned ? CS_DLV_VERSIONED : 0, gil_flags))
        cs_np_check_export_device(mt, versioned);
}

#define GIL_CHECK() cs_check_gil(__builtin_return_address(0), CS_NOGIL_CAPSULE)

/* An Arrow capsule: its destructor wrapped (a NULL one too: its death is
 * judged), its struct followed from here (arrow.c) */
__attribute__((noinline, cold)) static PyObject_ *arrow_new(void *ptr, const char *name,
                                                            cs_capsule_dtor dtor, int nk, uint8_t g)
{
    int k = stub_for(dtor);
    if (k < 0)
        return cs_py.Capsule_New(ptr, name, dtor);
    PyObject_ *cap = cs_py.Capsule_New(ptr, name, ar_stub((unsigned)k));
    if (!cap)
        return NULL;
    if (!capsule_type)
        learn_layout(cap, ptr, name, ar_stub((unsigned)k));
    cs_ar_new(cap, ptr, NK_AR_TYPE(nk), dtor != NULL, g);
    return cap;
}

/* R40: a capsule made under a name that is almost an Arrow one; made as
 * asked, and said once per name and call site (arrow.c) */
__attribute__((noinline, cold)) static PyObject_ *near_new(void *ptr, const char *name,
                                                           cs_capsule_dtor dtor, void *ret,
                                                           uint8_t g)
{
    PyObject_ *cap = cs_py.Capsule_New(ptr, name, dtor);
    if (cap)
        cs_ar_bad_name(cap, name, ret, g);
    return cap;
}

static PyObject_ *hook_New(void *ptr, const char *name, cs_capsule_dtor dtor)
{
    int nk = name_kind_new(name);
    uint8_t g = (uint8_t)GIL_CHECK();
    if (nk == NK_NONE || !cs_recording)
        return cs_py.Capsule_New(ptr, name, dtor);
    if (nk == NK_XAPI) /* a producer making its exchange table's capsule: followed now */
        return cs_py.Capsule_New(cs_xapi_table(ptr, 0), name, dtor);
    if (NK_IS_ARROW(nk))
        return arrow_new(ptr, name, dtor, nk, g);
    /* numpy's own numpy_dltensor capsule, made inside the from_dlpack call
     * whose consume event has the stack, is not an event: the delete it
     * makes later carries numpy's frames. Its destructor is wrapped all the
     * same, to judge a delete of a tensor released already before it runs
     * (judge_redelete) */
    if (nk != NK_DL && nk != NK_DLV) {
        if (nk == NK_AR_NEAR)
            return near_new(ptr, name, dtor, __builtin_return_address(0), g);
        int k = nk == NK_NPDL && dtor ? stub_for(dtor) : -1;
        return cs_py.Capsule_New(ptr, name, k < 0 ? dtor : stub((unsigned)k));
    }
    int k = stub_for(dtor);
    if (k < 0) /* out of stubs: a capsule capsan cannot follow is not tracked */
        return cs_py.Capsule_New(ptr, name, dtor);
    PyObject_ *cap = cs_py.Capsule_New(ptr, name, stub((unsigned)k));
    if (!cap)
        return NULL;
    if (!capsule_type)
        learn_layout(cap, ptr, name, stub((unsigned)k));
    CS_STACK_HINT();
    export(ptr, cap, nk == NK_DLV, g);
    return cap;
}

/* "MAJOR.MINOR" at s */
static int parse_version(const char *s, unsigned *major, unsigned *minor)
{
    char *end;
    unsigned long a = strtoul(s, &end, 10);
    if (end == s || *end != '.')
        return 0;
    const char *m = end + 1;
    unsigned long b = strtoul(m, &end, 10);
    if (end == m)
        return 0;
    *major = (unsigned)a;
    *minor = (unsigned)b;
    return 1;
}

/* The version of the torch a libtorch* module belongs to: from its file
 * name (Debian's libtorch_python.so.1.13.0), else from torch/version.py
 * beside its lib/ directory (the wheels: torch/lib/libtorch_python.so). */
static int torch_version(const char *path, unsigned *major, unsigned *minor)
{
    const char *so = strstr(path, ".so.");
    if (so && parse_version(so + 4, major, minor))
        return 1;
    const char *slash = strrchr(path, '/');
    char file[4096];
    if (!slash || (size_t)(slash - path) + sizeof "/../version.py" > sizeof file)
        return 0;
    memcpy(file, path, (size_t)(slash - path));
    memcpy(file + (slash - path), "/../version.py", sizeof "/../version.py");
    int fd = open(file, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return 0;
    char text[2048];
    ssize_t n = read(fd, text, sizeof text - 1);
    close(fd);
    if (n <= 0)
        return 0;
    text[n] = 0;
    /* the assignment, not a mention (__all__ names it first) */
    for (const char *v = text; (v = strstr(v, "__version__")); v++) {
        const char *q = v + sizeof "__version__" - 1;
        while (*q == ' ')
            q++;
        if (*q++ != '=')
            continue;
        while (*q == ' ')
            q++;
        if ((*q == '\'' || *q == '"') && parse_version(q + 1, major, minor))
            return 1;
    }
    return 0;
}

/* torch read from data and ignored byte_offset on import (R17; pytorch
 * issue 168177): 1.13 does [V]; 2.13 honors it [V] (the fix, PR 170432,
 * landed in 2026). A torch whose version cannot be told, or one between
 * the two, is taken to ignore it, as the rulebook says. Asked only for a
 * consume with byte_offset != 0; the answer is kept for the module. */
#define TORCH_OFFSET_FIXED_MAJOR 2
#define TORCH_OFFSET_FIXED_MINOR 13

static int consumer_ignores_offset(const void *ret)
{
    static _Atomic uintptr_t known; /* module base | 1 if it ignores it */
    Dl_info di;
    if (!ret || !dladdr(ret, &di) || !di.dli_fname || !strstr(di.dli_fname, "libtorch"))
        return 0;
    uintptr_t base = (uintptr_t)di.dli_fbase, k = atomic_load(&known);
    if (k && (k & ~(uintptr_t)1) == base)
        return (int)(k & 1);
    unsigned major, minor;
    int ignores = !torch_version(di.dli_fname, &major, &minor) ||
                  major < TORCH_OFFSET_FIXED_MAJOR ||
                  (major == TORCH_OFFSET_FIXED_MAJOR && minor < TORCH_OFFSET_FIXED_MINOR);
    atomic_store(&known, base | (uintptr_t)ignores);
    return ignores;
}

static int hook_SetName(PyObject_ *cap, const char *name)
{
    void *ret = __builtin_return_address(0);
    uint8_t g = (uint8_t)GIL_CHECK();
    int nk = name_kind(name);
    if (!cs_recording)
        return cs_py.Capsule_SetName(cap, name);
    /* one of ours has the trampoline as its destructor: asked of the
     * capsule itself, no table. Something that is not a capsule fails
     * here with the error SetName then raises again. */
    if (stub_index(cap_destructor(cap)) < 0)
        return cs_py.Capsule_SetName(cap, name);
    const char *old = cap_name(cap);
    int ok = name_kind(old);
    if (NK_IS_ARROW(ok)) {
        int rc = cs_py.Capsule_SetName(cap, name);
        if (rc == 0)
            cs_ar_renamed(cap);
        return rc;
    }
    struct { void *mt; int versioned; } e = {cap_pointer(cap, old),
                                             ok == NK_DLV || ok == NK_USEDV};
    int rc = cs_py.Capsule_SetName(cap, name);
    if (rc != 0 || !e.mt)
        return rc;
    if (nk == NK_USED || nk == NK_USEDV) {
        /* R8: a versioned capsule's consumed name is used_dltensor_versioned */
        int wrong = (nk == NK_USED && ok == NK_DLV) || (nk == NK_USEDV && ok == NK_DL);
        cs_event ev = {.kind = CS_EV_CONSUME, .obj = (uint64_t)(uintptr_t)e.mt,
                       .a = (uint64_t)(uintptr_t)cap, .b = (uint64_t)(uintptr_t)ret,
                       .aux = (uint16_t)((e.versioned ? CS_DLV_VERSIONED : 0) |
                                         (wrong ? CS_CONSUME_WRONG_NAME : 0)),
                       .flags = g};
        /* R20: the loaned metadata must not have changed since export */
        uint64_t off, data;
        uint32_t fp = cs_dl_consume_view(e.mt, e.versioned, &off, &data);
        ev.c = data; /* what a consumer kept alive at shutdown holds (lifecycle.c) */
        if (off && consumer_ignores_offset(ret)) {
            ev.flags |= CS_EVF_OFFSET_IGNORED;
            ev.c = off;
        }
        cs_event origin;
        int found;
        CS_STACK_HINT();
        unsigned v = cs_emit(&ev, 1, &origin, &found);
        /* a struct renamed just after its consumer released it is gone:
         * its memory is not compared (a released one consumed again is,
         * as evidence beside the reconsume) */
        if (found && !(v & CS_VERDICT_LATE_RENAME))
            cs_dl_check_loan(&ev, &origin, fp);
        if (found && origin.kind == CS_EV_EXPORT && (origin.flags & CS_EVF_NULL_DELETER))
            cs_dl_took_null(e.mt);
        if (wrong) {
            cs_event b = {.kind = CS_EV_BAD_TENSOR, .obj = ev.obj, .a = ev.a, .aux = 8,
                          .extra = CS_BAD_RENAME_VERSION, .stack = ev.stack};
            cs_emit(&b, 0, NULL, NULL);
        }

    } else if (nk == NK_DL || nk == NK_DLV) {
        atomic_store_explicit(&cs_dl_unconsumed_released, 1, memory_order_relaxed);
    } else if (is_ar_stub(cap_destructor(cap))) {
        cs_ar_renamed(cap); /* an Arrow capsule renamed again */
    } else {
        cs_event b = {.kind = CS_EV_BAD_TENSOR, .obj = (uint64_t)(uintptr_t)e.mt,
                      .a = (uint64_t)(uintptr_t)cap, .aux = 7, .extra = CS_BAD_RENAME};
        cs_emit(&b, 1, NULL, NULL);
    }
    return rc;
}

/* numpy's handler capsule name as numpy's own calls pass it: one literal
 * of its module, learned at its first call (see hook_np_GetPointer) */
static const char *np_handler_name;

/* numpy's other names no rule is about (numpy 2 reads its ufuncs'
 * "numpy.ufunc.extobj" twice an iteration of W1, its promoters at import):
 * literals of its own file, each known by its address once learned */
#define NP_OTHER 4
static const char *np_other[NP_OTHER];
static _Atomic unsigned np_other_tries; /* learning stops after a few */

static inline int np_other_name(const char *name)
{
    for (int i = 0; i < NP_OTHER; i++)
        if (name == np_other[i])
            return 1;
    return 0;
}

/* a name of numpy's own file, read-only (a literal, never rewritten),
 * that names nothing capsan follows (NK_NONE): remembered */
static void np_learn_other(const char *name, const void *site)
{
    Dl_info a, b;
    if (atomic_load_explicit(&np_other_tries, memory_order_relaxed) >= 64 ||
        atomic_fetch_add(&np_other_tries, 1) >= 64 || !dladdr(name, &a) || !dladdr(site, &b) ||
        a.dli_fbase != b.dli_fbase)
        return;
    for (int i = 0; i < NP_OTHER; i++)
        if (!np_other[i]) {
            np_other[i] = name;
            return;
        }
}

/* numpy: a call from numpy's own module (its names may be learned) */
static inline __attribute__((always_inline)) void *get_pointer(PyObject_ *cap, const char *name,
                                                              const void *site, int numpy)
{
    unsigned g = cs_check_gil(site, CS_NOGIL_CAPSULE);
    void *p = cs_py.Capsule_GetPointer(cap, name);
    int nk;
    if (name && name[0] == 'm' && eq(name, "mem_handler")) {
        /* numpy reads the handler right before it allocates or frees */
        cs_np_note_handler(cap, p, g);
        return p;
    }
    if (!p || !cs_recording)
        return p;
    if ((nk = name_kind(name)) == NK_NONE && numpy)
        np_learn_other(name, site);
    if (nk == NK_NONE || nk == NK_NPDL)
        return p;
    if (nk == NK_XAPI)
        return cs_xapi_table(p, 1); /* the table, patched, or capsan's shadow */
    if (in_dtor_of(cap)) {
        /* the producer's destructor reading its own capsule */
        if (nk == NK_DL || nk == NK_DLV)
            dtor_took = cap;
        return p;
    }
    if (NK_IS_ARROW(nk)) {
        cs_ar_read(cap, p);
        return p;
    }
    cs_event ev = {.obj = (uint64_t)(uintptr_t)p, .a = (uint64_t)(uintptr_t)cap};
    if (nk == NK_USED || nk == NK_USEDV) {
        ev.kind = CS_EV_GETPTR_USED;
    } else {
        /* a consumer reading an unconsumed capsule: only a released
         * tensor makes that an event. A tensor is released while its
         * capsule still has an unconsumed name only after a delete before
         * the rename, a rename back or a finding: until then, no lookup */
        if (!cs_findings_judged() &&
            !atomic_load_explicit(&cs_dl_unconsumed_released, memory_order_relaxed))
            return p;
        cs_young_dl_adopt(ev.obj);
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

static void *hook_GetPointer(PyObject_ *cap, const char *name)
{
    return get_pointer(cap, name, __builtin_return_address(0), 0);
}

/* numpy's own calls (two per array: its alloc and its free read the
 * handler): the handler's name is known by its address, the rest is as
 * for any caller */
__attribute__((noinline)) static void *np_get_pointer(PyObject_ *cap, const char *name,
                                                      const void *site)
{
    if (name && np_other_name(name)) {
        cs_check_gil(site, CS_NOGIL_CAPSULE);
        return cs_py.Capsule_GetPointer(cap, name);
    }
    if (name && name[0] == 'm' && eq(name, "mem_handler"))
        np_handler_name = name; /* a literal: it stays */
    return get_pointer(cap, name, site, 1);
}

static void *hook_np_GetPointer(PyObject_ *cap, const char *name)
{
    if (__builtin_expect(name != np_handler_name || !name, 0))
        return np_get_pointer(cap, name, __builtin_return_address(0));
    unsigned g = cs_check_gil(__builtin_return_address(0), CS_NOGIL_CAPSULE);
    void *p = cs_py.Capsule_GetPointer(cap, name);
    cs_np_note_handler(cap, p, g);
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
    /* ours stays ours: the stub of the new destructor takes over (when
     * the stubs have run out, the capsule gets d itself) */
    cs_capsule_dtor cur;
    if (stub_index(d) < 0 && stub_index(cur = cap_destructor(cap)) >= 0) {
        int k = stub_for(d);
        if (k >= 0)
            d = is_ar_stub(cur) ? ar_stub((unsigned)k) : stub((unsigned)k);
    }
    return cs_py.Capsule_SetDestructor(cap, d);
}

static cs_capsule_dtor hook_GetDestructor(PyObject_ *cap)
{
    GIL_CHECK();
    return unwrap(cs_py.Capsule_GetDestructor(cap));
}

static int hook_SetPointer(PyObject_ *cap, void *p)
{
    GIL_CHECK();
    return cs_py.Capsule_SetPointer(cap, p);
}

/* A capsule destructor reporting the capsule it destroys (numpy 1.22-2.0
 * do on a name they do not expect) takes a reference to it and drops it:
 * the dying capsule is deallocated again, inside its own destructor,
 * until the stack runs out (R4). Said here, before that; with protect=1
 * the capsule is kept alive through the call, so it dies once. */
static void hook_WriteUnraisable(PyObject_ *obj)
{
    cs_thread *t = cs_thread_tls;
    if (!obj || !t || t->dtor_capsule != obj || !cs_recording) {
        cs_py.Err_WriteUnraisable(obj);
        return;
    }
    if (reentered != obj) {
        reentered = obj;
        reentry_event(obj, cap_pointer(obj, cap_name(obj)));
    }
    if (!cs_opt.protect) {
        cs_py.Err_WriteUnraisable(obj);
        return;
    }
    /* its reference count is 0 while capsule_dealloc runs: one more keeps
     * the reporting's own reference from ending at 0, and the count goes
     * back to 0 for the dealloc under way */
    intptr_t *refcnt = (intptr_t *)obj;
    ++*refcnt;
    cs_py.Err_WriteUnraisable(obj);
    *refcnt = 0;
}

const cs_hook cs_capsule_hooks[] = {
    {"PyErr_WriteUnraisable", (void *)hook_WriteUnraisable, NULL},
    {"PyCapsule_New", (void *)hook_New, NULL},
    {"PyCapsule_SetName", (void *)hook_SetName, NULL},
    {"PyCapsule_GetPointer", (void *)hook_np_GetPointer, "_multiarray_umath"},
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
    return cap ? (void *)(uintptr_t)unwrap(cs_py.Capsule_GetDestructor(cap)) : NULL;
}

void *capsan_original_deleter(void *mt)
{
    cs_event origin;
    int found;
    if (!mt || !cs_lc)
        return NULL;
    cs_young_dl_adopt((uint64_t)(uintptr_t)mt);
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
