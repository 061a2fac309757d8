/* PyCapsule_GetPointer (see capsule_get.h): a consumer reading a capsule,
 * and numpy's own calls, which read the NEP 49 handler's capsule twice an
 * array and are answered by the name's address. */
#include "capsule_get.h"

#include <dlfcn.h>
#include <stdatomic.h>

#include "arrow.h"
#include "capsule_dtor.h"
#include "capsule_int.h"
#include "deleter.h"
#include "names.h"
#include "numpy.h"
#include "pyapi.h"
#include "runtime.h"
#include "xapi.h"
#include "young.h"

/* numpy's handler capsule name as numpy's own calls pass it: one literal
 * of its module, learned at its first call (see cs_hook_np_GetPointer) */
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
            cs_dtor_took = cap;
        return p;
    }
    if (NK_IS_ARROW(nk)) {
        cs_ar_read(cap, p, site);
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

void *cs_hook_GetPointer(PyObject_ *cap, const char *name)
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

void *cs_hook_np_GetPointer(PyObject_ *cap, const char *name)
{
    if (__builtin_expect(name != np_handler_name || !name, 0))
        return np_get_pointer(cap, name, __builtin_return_address(0));
    unsigned g = cs_check_gil(__builtin_return_address(0), CS_NOGIL_CAPSULE);
    void *p = cs_py.Capsule_GetPointer(cap, name);
    cs_np_note_handler(cap, p, g);
    return p;
}
