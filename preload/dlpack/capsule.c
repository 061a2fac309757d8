/* PyCapsule hooks (see capsule.h): a capsule made, renamed, its destructor
 * or pointer set, and the table of every PyCapsule hook. A dying capsule is
 * capsule_dtor.c's, a read capsule_get.c's.
 *
 * Most capsule traffic is not DLPack (import torch alone makes thousands
 * of capsules): each hook decides by the name's first letter before doing
 * anything else. */
#include "capsule.h"

#include <stdatomic.h>
#include <stdint.h>

#include "arrow.h"
#include "capsule_dtor.h"
#include "capsule_get.h"
#include "capsule_int.h"
#include "consumer_view.h"
#include "deleter.h"
#include "dltensor.h"
#include "names.h"
#include "numpy.h"
#include "pyapi.h"
#include "runtime.h"
#include "stack.h"
#include "torch_offset.h"
#include "xapi.h"

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
                                                            cs_capsule_dtor dtor, int nk, uint8_t g,
                                                            const void *maker)
{
    int k = cs_capsule_stub_for(dtor);
    if (k < 0)
        return cs_py.Capsule_New(ptr, name, dtor);
    PyObject_ *cap = cs_py.Capsule_New(ptr, name, ar_stub((unsigned)k));
    if (!cap)
        return NULL;
    if (!cs_capsule_type)
        cs_capsule_learn_layout(cap, ptr, name, ar_stub((unsigned)k));
    cs_ar_new(cap, ptr, NK_AR_TYPE(nk), dtor != NULL, g, maker);
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
        return arrow_new(ptr, name, dtor, nk, g, __builtin_return_address(0));
    /* numpy's own numpy_dltensor capsule, made inside the from_dlpack call
     * whose consume event has the stack, is not an event: the delete it
     * makes later carries numpy's frames. Its destructor is wrapped all the
     * same, to judge a delete of a tensor released already before it runs
     * (judge_redelete, capsule_dtor.c) */
    if (nk != NK_DL && nk != NK_DLV) {
        if (nk == NK_AR_NEAR)
            return near_new(ptr, name, dtor, __builtin_return_address(0), g);
        int k = nk == NK_NPDL && dtor ? cs_capsule_stub_for(dtor) : -1;
        return cs_py.Capsule_New(ptr, name, k < 0 ? dtor : stub((unsigned)k));
    }
    int k = cs_capsule_stub_for(dtor);
    if (k < 0) /* out of stubs: a capsule capsan cannot follow is not tracked */
        return cs_py.Capsule_New(ptr, name, dtor);
    PyObject_ *cap = cs_py.Capsule_New(ptr, name, stub((unsigned)k));
    if (!cap)
        return NULL;
    if (!cs_capsule_type)
        cs_capsule_learn_layout(cap, ptr, name, stub((unsigned)k));
    CS_STACK_HINT();
    export(ptr, cap, nk == NK_DLV, g);
    return cap;
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
        /* R17: torch by its version; a consumer in Python by the array
         * it made (consumer_view.c) */
        int seen = 0;
        if (off && (cs_consumer_ignores_offset(ret) ||
                    (seen = cs_consumer_view(ret, data, off) == CS_VIEW_IGNORED))) {
            ev.flags |= CS_EVF_OFFSET_IGNORED;
            ev.aux |= seen ? CS_CONSUME_VIEW_SEEN : 0;
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
        int k = cs_capsule_stub_for(d);
        if (k >= 0)
            d = is_ar_stub(cur) ? ar_stub((unsigned)k) : stub((unsigned)k);
    }
    return cs_py.Capsule_SetDestructor(cap, d);
}

static cs_capsule_dtor hook_GetDestructor(PyObject_ *cap)
{
    GIL_CHECK();
    return cs_capsule_unwrap(cs_py.Capsule_GetDestructor(cap));
}

/* A producer re-arming a DLPack capsule of its own with the next tensor
 * (onnxruntime's to_dlpacks renames the consumed capsule back to
 * "dltensor" and sets its pointer): the new pointer is a loan born here,
 * as if in a new capsule, else it would die or leak unseen */
static int hook_SetPointer(PyObject_ *cap, void *p)
{
    uint8_t g = (uint8_t)GIL_CHECK();
    if (!cs_recording || !p || stub_index(cap_destructor(cap)) < 0)
        return cs_py.Capsule_SetPointer(cap, p);
    int nk = name_kind(cap_name(cap));
    int rc = cs_py.Capsule_SetPointer(cap, p);
    if (rc == 0 && (nk == NK_DL || nk == NK_DLV)) {
        CS_STACK_HINT();
        export(p, cap, nk == NK_DLV, g);
    }
    return rc;
}

const cs_hook cs_capsule_hooks[] = {
    {"PyErr_WriteUnraisable", (void *)cs_hook_WriteUnraisable, NULL},
    {"PyCapsule_New", (void *)hook_New, NULL},
    {"PyCapsule_SetName", (void *)hook_SetName, NULL},
    {"PyCapsule_GetPointer", (void *)cs_hook_np_GetPointer, "_multiarray_umath"},
    {"PyCapsule_GetPointer", (void *)cs_hook_GetPointer, NULL},
    {"PyCapsule_IsValid", (void *)hook_IsValid, NULL},
    {"PyCapsule_SetDestructor", (void *)hook_SetDestructor, NULL},
    {"PyCapsule_GetDestructor", (void *)hook_GetDestructor, NULL},
    {"PyCapsule_SetPointer", (void *)hook_SetPointer, NULL},
};
const int cs_capsule_nhooks = sizeof cs_capsule_hooks / sizeof cs_capsule_hooks[0];
