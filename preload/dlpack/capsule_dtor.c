/* A capsule dying (see capsule_dtor.h): capsan's destructor stubs, the
 * producers' destructors they stand in for, and the bodies the stubs jump
 * to, which run that destructor and tell the lifecycle how the capsule
 * died. R4's re-entry is said here too, whichever way it is first seen. */
#include "capsule_dtor.h"

#include <stdatomic.h>

#include "arrow.h"
#include "capsule_int.h"
#include "deleter.h"
#include "names.h"
#include "options.h"
#include "pyapi.h"
#include "runtime.h"
#include "spin.h"
#include "stack.h"
#include "young.h"

/* ---- the stubs (capsule_int.h tells them apart) ---- */
/* (the bodies are `used`: only the stubs' asm calls them, and the link
 * time optimizer sees no asm) */
void cs_capsule_dtor_body(PyObject_ *cap, unsigned k);
void cs_ar_capsule_dtor_body(PyObject_ *cap, unsigned k);
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

int cs_capsule_stub_for(cs_capsule_dtor d)
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

cs_capsule_dtor cs_capsule_unwrap(cs_capsule_dtor d)
{
    int k = stub_index(d);
    return k >= 0 ? dtors[k] : d;
}

/* ---- the bodies ---- */

/* The capsule whose running destructor took its pointer under the
 * unconsumed name (capsule_get.c): a destructor that then releases the
 * tensor without going through the deleter field (JAX's calls its deleter
 * function directly) did release it. */
__thread const void *cs_dtor_took __attribute__((tls_model("initial-exec")));

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
    const void *saved_took = cs_dtor_took;
    cs_dtor_took = NULL;
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
    int took = t && cs_dtor_took == cap;
    cs_dtor_took = saved_took;
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

/* A capsule destructor reporting the capsule it destroys (numpy 1.22-2.0
 * do on a name they do not expect) takes a reference to it and drops it:
 * the dying capsule is deallocated again, inside its own destructor,
 * until the stack runs out (R4). Said here, before that; with protect=1
 * the capsule is kept alive through the call, so it dies once. */
void cs_hook_WriteUnraisable(PyObject_ *obj)
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
