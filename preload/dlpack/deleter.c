/* The deleter trampoline and a tensor's birth (see deleter.h). */
#include "deleter.h"

#include <stdio.h>

#include "options.h"
#include "probe.h"
#include "pyapi.h"
#include "quarantine.h"
#include "reexport.h"
#include "runtime.h"
#include "stack.h"
#include "young.h"

static __thread void *last_null __attribute__((tls_model("initial-exec")));
__thread cs_dl_pending_t cs_dl_pending __attribute__((tls_model("initial-exec")));
_Atomic int cs_dl_unconsumed_released;

void *cs_dl_last_null(void) { return last_null; }

PyObject_ *cs_dl_err_before(int gil)
{
    return gil ? cs_py.Err_Occurred() : NULL;
}

void cs_dl_err_after(int gil, PyObject_ *before, void *mt, PyObject_ *cap)
{
    if (!gil)
        return;
    PyObject_ *after = cs_py.Err_Occurred();
    if (after == before)
        return;
    cs_event ev = {.kind = CS_EV_ERR_STATE, .obj = (uint64_t)(uintptr_t)mt,
                   .a = (uint64_t)(uintptr_t)cap,
                   .aux = (uint16_t)(!after ? CS_ERRST_CLEARED : before ? CS_ERRST_REPLACED
                                                                        : CS_ERRST_LEFT),
                   .flags = CS_EVF_GIL_KNOWN | CS_EVF_GIL};
    cs_emit(&ev, 1, NULL, NULL);
}
void cs_dl_took_null(void *mt) { last_null = mt; }

void cs_dl_check_loan(const cs_event *ev, const cs_event *export, uint32_t fp)
{
    if (export->kind != CS_EV_EXPORT || !export->extra || export->extra == fp)
        return;
    cs_event b = {.kind = CS_EV_BAD_TENSOR, .obj = ev->obj, .a = ev->a, .aux = 20,
                  .extra = CS_BAD_MUTATED, .stack = ev->stack};
    cs_emit(&b, 0, NULL, NULL);
}

void cs_dl_deleter_tramp(void *mt)
{
    cs_thread *t = cs_thread_get();
    if (t && t->predicted == mt && t->dtor_capsule) {
        /* this destructor's delete was judged before the destructor ran
         * (cs_capsule_dtor_body): run it as judged, once */
        void (*fn)(void *) = (void (*)(void *))(uintptr_t)t->predicted_fn;
        t->predicted = NULL;
        if (fn) /* released already: its second free is not done */
            cs_qr_call(fn, mt, -1, (void *)cs_dl_deleter_tramp);
        return;
    }
    if (__builtin_expect(cs_dl_pending.mt == mt, 0) && mt) {
        cs_dl_pending.mt = NULL;
        cs_dl_pending.born(mt); /* to_py deleting what it was given */
    }
    int python = cs_recording && cs_py.ok;
    int live = python && cs_py_live();
    int held = live && cs_gil_held();
    int nogil = live && !held;
    /* inside a capsule's destructor, releasing what that capsule held; a
     * struct another capsule's destructor releases on the way (a torch
     * tensor dying inside numpy's owner capsule's) is an ordinary release,
     * whatever capsule once lay at that address */
    void *dcap = t && t->dtor_mt == mt ? t->dtor_capsule : NULL;
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
    CS_STACK_HINT();
    unsigned verdict = cs_emit(&ev, 1, &origin, &found);
    if (verdict & CS_VERDICT_UNRENAMED)
        atomic_store_explicit(&cs_dl_unconsumed_released, 1, memory_order_relaxed);
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
    /* R20 on the consumer's side: the metadata must reach the deleter as it
     * was exported (a change before the consume was reported there). Only
     * a live struct is read: a released one may be gone. */
    if (found == 1 && origin.extra && cs_recording)
        cs_dl_check_loan(&ev, &origin, cs_dl_fingerprint(mt, (origin.aux & CS_DLV_VERSIONED) != 0));
    /* torch calls foreign deleters without the GIL (R12): whatever Python
     * the deleter reaches without taking it is reported (cs_check_gil) */
    if (nogil)
        cs_deleter_nogil(1);
    unsigned frees = cs_frees;
    PyObject_ *err = cs_dl_err_before(held); /* the GIL state known above */
    /* the struct's free is deferred (quarantine.c): a later release
     * still finds the trampoline in its deleter field */
    cs_qr_call((void (*)(void *))(uintptr_t)origin.b, mt,
               found == 2 ? -1 : (origin.aux & CS_DLV_VERSIONED) != 0, (void *)cs_dl_deleter_tramp);
    cs_dl_err_after(held, err, mt, NULL);
    if (nogil)
        cs_deleter_nogil(0);
    if (python && !live && cs_frees == frees) {
        /* during interpreter shutdown a deleter may decline to run (numpy's
         * does once Py_IsInitialized() is 0): it freed nothing, so what
         * it should have released is still there (lifecycle.c judges) */
        cs_event d = {.kind = CS_EV_DROPPED, .obj = ev.obj, .c = ev.c, .stack = ev.stack};
        cs_emit(&d, 0, NULL, NULL);
    }
}

/* A birth's check findings, sharing one stack: the birth's, or with stack
 * 0 (a struct that cannot be followed, so no birth event) the first
 * finding's own. */
static void emit_problems(const cs_loan *l, uint64_t a, uint32_t stack)
{
    for (int i = 0; i < l->np; i++) {
        cs_event b = {.kind = CS_EV_BAD_TENSOR, .obj = (uint64_t)(uintptr_t)l->mt, .a = a,
                      .aux = (uint16_t)l->probs[i].rule, .extra = l->probs[i].code,
                      .b = (uint64_t)l->probs[i].value, .stack = stack};
        cs_emit(&b, !stack, NULL, NULL);
        stack = b.stack;
    }
}

int cs_dl_wrap(cs_loan *l, void *mt, int versioned)
{
    l->mt = mt;
    l->versioned = versioned;
    l->followed = 0;
    l->deleter = NULL;
    l->np = cs_dl_check(mt, versioned, l->probs, 8, &l->nbytes, &l->fp, &l->data);
    if (l->np && (l->probs[0].code == CS_BAD_NULL_POINTER || l->probs[0].code == CS_BAD_UNREADABLE))
        return 0; /* no struct to read or wrap: what the program does with it is its own */
    void **slot = cs_dl_deleter_slot(mt, versioned);
    void *orig = *slot;
    if (orig == (void *)cs_dl_deleter_tramp) {
        /* lent again while wrapped: keep the original we know */
        cs_event origin;
        uint64_t key = (uint64_t)(uintptr_t)mt;
        cs_young_dl_adopt(key);
        cs_lc_lock(cs_lc, key);
        int found = cs_lc_origin(cs_lc, CS_NS_DLPACK, key, &origin);
        cs_lc_unlock(cs_lc, key);
        l->deleter = found ? (void *)(uintptr_t)origin.b : NULL;
    } else if (orig && !cs_probe_store(slot, (void *)cs_dl_deleter_tramp)) {
        /* a read-only struct (static const): its deleter cannot be
         * followed, so neither can the rest of its life */
        return 0;
    } else {
        l->deleter = orig;
    }
    l->followed = 1;
    return 1;
}

int cs_dl_lent(cs_loan *l, uint64_t a, uint16_t aux, uint8_t flags)
{
    if (!l->followed) {
        emit_problems(l, a, 0);
        return 0;
    }
    if (aux & CS_DLV_X)
        a = l->data; /* no capsule: the birth says where its data is */
    cs_event ev = {.kind = CS_EV_EXPORT, .obj = (uint64_t)(uintptr_t)l->mt, .a = a,
                   .b = (uint64_t)(uintptr_t)l->deleter, .c = l->nbytes,
                   .aux = (uint16_t)(aux | (l->versioned ? CS_DLV_VERSIONED : 0)),
                   .flags = (uint8_t)((l->deleter ? 0 : CS_EVF_NULL_DELETER) | flags),
                   .extra = l->fp};
    cs_emit(&ev, 1, NULL, NULL);
    if (!(aux & CS_DLV_X))
        cs_dl_reexport_check(l, ev.stack); /* a consumer handing on what it took */
    if (!l->deleter && cs_opt.verbosity)
        dprintf(2, "capsan: note: DLManagedTensor %p %s with a NULL deleter (legal, R10: "
                   "consumers must not call it)\n", l->mt,
                (aux & CS_DLV_X) ? "lent through the exchange API" : "exported");
    emit_problems(l, (aux & CS_DLV_X) ? 0 : a, ev.stack);
    return 1;
}

int cs_dl_lend(void *mt, uint64_t a, uint16_t aux, uint8_t flags)
{
    cs_loan l;
    cs_dl_wrap(&l, mt, (aux & CS_DLV_VERSIONED) != 0);
    return cs_dl_lent(&l, a, aux, flags);
}
