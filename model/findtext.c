/* The words reports use for findings and events (the kinds themselves:
 * kinds.c). */
#include "lifecycle.h"
#include "arrowtext.h"

#include <stdio.h>
#include <string.h>

/* the exchange API's births: which entry made the tensor (CS_DLV_X*) */
static const char *xbirth_name(unsigned aux)
{
    return (aux & CS_DLV_XFROM)    ? "exchange-from-py"
         : (aux & CS_DLV_XALLOC) ? "exchange-alloc"
         : (aux & CS_DLV_XTO)    ? "exchange-to-py"
         : (aux & CS_DLV_XVIEW)  ? "exchange-view"
                                 : NULL;
}

/* a call without the GIL made on a free-threaded build: there the rule
 * is an attached thread state (CS_NOGIL_FREE_THREADED, set by the runtime) */
static int nogil_ft(const cs_finding *f)
{
    for (int i = 0; i < f->nevents; i++)
        if (f->events[i].kind == CS_EV_NO_GIL && (f->events[i].extra & CS_NOGIL_FREE_THREADED))
            return 1;
    return 0;
}

const char *cs_event_name(const cs_event *ev)
{
    if (CS_EV_IS_ARROW(ev->kind))
        return cs_ar_event_name(ev);
    switch (ev->kind) {
    case CS_EV_EXPORT: {
        const char *x = xbirth_name(ev->aux);
        return x ? x : "export";
    }
    case CS_EV_XHANDOVER: return "exchange-to-py";
    case CS_EV_XCHECK: return "exchange-call";
    case CS_EV_OWN: return "own";
    case CS_EV_CONSUME: return "consume";
    case CS_EV_GETPTR_USED:
    case CS_EV_GETPTR: return "reconsume";
    case CS_EV_NO_GIL: return "call";
    case CS_EV_DEVICE: return "alloc";
    case CS_EV_DATA_FREED: return "free";
    case CS_EV_DELETE:
        return ev->aux == CS_DELETE_VIEW_END    ? "view-end"
               : ev->aux == CS_DELETE_VIEW_KEPT ? "view-kept"
                                                : "delete";
    case CS_EV_DROPPED: return "dropped";
    case CS_EV_DESTROY: return "destroy";
    case CS_EV_BAD_TENSOR: return "check";
    case CS_EV_NP_ALLOC: return "alloc";
    case CS_EV_NP_FREE: return "free";
    case CS_EV_NP_HANDLER: return "handler";
    case CS_EV_NP_FOREIGN_FREE: return "free";
    case CS_EV_NP_REACHABLE:
    case CS_EV_REACHABLE: return "reachable";
    case CS_EV_NP_WRAP: return "wrap";
    case CS_EV_NP_ORPHAN: return "handler-died";
    case CS_EV_ERR_STATE: return "error-state";
    case CS_EV_REEXPORT: return "reexport";
    }
    return "event";
}

const char *cs_event_phrase(const cs_finding *f, int i)
{
    const cs_event *ev = &f->events[i];
    if (CS_EV_IS_ARROW(ev->kind))
        return cs_ar_event_phrase(f, i);
    int earlier = 0;
    for (int j = 0; j < i; j++)
        if (f->events[j].kind == ev->kind)
            earlier++;
    switch (ev->kind) {
    case CS_EV_EXPORT:
        if (ev->aux & CS_DLV_XFROM)
            return "taken from its Python object (managed_tensor_from_py_object_no_sync) at";
        if (ev->aux & CS_DLV_XALLOC)
            return "allocated through the exchange table (managed_tensor_allocator) at";
        if (ev->aux & CS_DLV_XTO)
            return (ev->aux & CS_DLV_HANDED)
                       ? "handed to managed_tensor_to_py_object_no_sync at"
                       : "given to managed_tensor_to_py_object_no_sync, which failed, at";
        if (ev->aux & CS_DLV_XVIEW)
            return "viewed without ownership (dltensor_from_py_object_no_sync) at";
        return earlier ? "exported again at" : "exported at";
    case CS_EV_XHANDOVER: return "handed to managed_tensor_to_py_object_no_sync at";
    case CS_EV_XCHECK: return "exchange-API call at";
    case CS_EV_OWN: return "wrapped in numpy's numpy_dltensor capsule at";
    case CS_EV_CONSUME: return earlier ? "consumed again at" : "consumed at";
    case CS_EV_GETPTR_USED: return "pointer taken from the consumed capsule at";
    case CS_EV_GETPTR: return "pointer taken again at";
    case CS_EV_NO_GIL:
        return (ev->extra & CS_NOGIL_FREE_THREADED) ? "called without an attached thread state at"
                                                     : "called without the GIL at";
    case CS_EV_DEVICE: return "its data was allocated by that handler at";
    case CS_EV_DATA_FREED: return "its data freed at";
    case CS_EV_DELETE:
        if (ev->aux == CS_DELETE_NULL_CALL)
            return "NULL deleter called at";
        if (ev->aux == CS_DELETE_VIEW_END)
            return "the view's caller had returned by";
        if (ev->aux == CS_DELETE_VIEW_KEPT)
            return "the view's caller had returned, its DLTensor kept in static or heap memory, by";
        if (ev->flags & CS_EVF_SKIPPED)
            return "deleter call skipped (protect=1) at";
        /* by the exporting capsule's destructor (the export event names
         * that capsule), or by another's, numpy's owner capsule */
        if ((ev->flags & CS_EVF_IN_DTOR) && f->nevents && f->events[0].kind == CS_EV_EXPORT &&
            ev->a == f->events[0].a)
            return earlier ? "deleted again by the capsule destructor at"
                           : "deleted by the capsule destructor at";
        return earlier ? "deleted again at" : "deleted at";
    case CS_EV_DESTROY:
        return (ev->extra & CS_DESTROY_REENTERED) ? "its destructor entered again at"
                                                  : "capsule destroyed at";
    case CS_EV_DROPPED: return "its deleter released nothing (interpreter shutdown) at";
    case CS_EV_BAD_TENSOR: return "checked at";
    case CS_EV_NP_ALLOC: return "allocated at";
    case CS_EV_NP_FREE: return earlier ? "freed again at" : "freed at";
    case CS_EV_NP_HANDLER: return "handler installed at";
    case CS_EV_NP_ORPHAN:
        return ev->extra == CS_STALE_CTX_FREED ? "its handler's ctx freed, the block still alive, at"
                                               : "its handler's struct freed, the block still alive, at";
    case CS_EV_ERR_STATE:
        return ev->a ? "its capsule destructor returned at" : "its deleter returned at";
    case CS_EV_REEXPORT: return "re-exported from its data field, byte_offset dropped, at";
    case CS_EV_NP_REACHABLE:
    case CS_EV_REACHABLE:
        return ev->aux == CS_WHERE_THREAD
                 ? "held at the end by a Python thread still running (a daemon thread), which made or took it last"
               : ev->aux == CS_WHERE_THREAD_FRAMES
                 ? "held at the end by a Python thread still running (a daemon thread), whose frames reach it"
               : ev->aux == CS_WHERE_ARROW_BUFFER
                 ? "held at the end by a pyarrow buffer made around its array (zero-copy), which a module "
                   "still reached as the interpreter began to exit: pyarrow lets go of it at shutdown "
                   "without releasing the array"
               : ev->aux == CS_WHERE_MODULE_KEPT
                 ? "held at the end by a module's globals, which the interpreter never cleared (a function "
                   "registered with a library, such as a hook, keeps them alive)"
               : ev->aux == CS_WHERE_PY_REACHED
                 ? "held at the end by Python objects that outlived finalization (a module's globals reached "
                   "it at atexit: pytest's items, a library's cache)"
                 : "still referenced at the end: its address is stored in the process's memory";
    case CS_EV_NP_WRAP:
        return ev->a == ev->obj ? "array made around this memory at"
                                : "array made around the memory this pointer lies in at";
    case CS_EV_NP_FOREIGN_FREE:
        for (int j = 0; j < i; j++)
            if (f->events[j].kind == CS_EV_NP_FREE || f->events[j].kind == CS_EV_NP_FOREIGN_FREE)
                return "freed again with libc free() by numpy at";
        return "freed with libc free() by numpy at";
    }
    return "at";
}

const char *cs_finding_object_type(const cs_finding *f)
{
    if (f->kind == CS_KIND_LIVE_AT_EXIT && f->nevents && f->events[0].kind == CS_EV_NP_ALLOC)
        return "numpy data";
    if (f->kind == CS_KIND_LIVE_AT_EXIT && f->nevents && f->events[0].kind == CS_EV_AR_EXPORT)
        return cs_ar_object_type(f);
    if (CS_KIND_IS_ARROW(f->kind))
        return cs_ar_object_type(f);
    switch (f->kind) {
    case CS_KIND_NUMPY_BAD_HANDLER: return "PyDataMem_Handler";
    case CS_KIND_NUMPY_LEAK:
    case CS_KIND_NUMPY_DOUBLE_FREE:
    case CS_KIND_NUMPY_FOREIGN_FREE:
    case CS_KIND_NUMPY_STALE_HANDLER:
    case CS_KIND_NUMPY_HANDLER_NO_GIL: return "numpy data";
    case CS_KIND_CAPSULE_NO_GIL:
    case CS_KIND_DLPACK_DELETER_NO_GIL: return "call site";
    case CS_KIND_DLPACK_BAD_EXCHANGE_TABLE: return "DLPackExchangeAPI";
    case CS_KIND_DLPACK_STALE_VIEW: return "DLTensor";
    case CS_KIND_DLPACK_EXCHANGE_CONTRACT:
        if (f->nevents && f->events[0].kind == CS_EV_XCHECK)
            return "DLPackExchangeAPI call";
        break;
    }
    for (int i = 0; i < f->nevents; i++)
        if (f->events[i].kind == CS_EV_EXPORT)
            return (f->events[i].aux & CS_DLV_VERSIONED) ? "DLManagedTensorVersioned"
                                                          : "DLManagedTensor";
    return "DLManagedTensor";
}

static const char *bad_text(uint32_t d)
{
    switch (d) {
    case CS_BAD_NULL_POINTER: return "the capsule holds a NULL pointer (R1)";
    case CS_BAD_UNREADABLE: return "the capsule's pointer does not point to readable memory (R1)";
    case CS_BAD_UNREADABLE_SHAPE: return "shape does not point to readable memory (R15)";
    case CS_BAD_NDIM: return "ndim is negative or absurdly large (R15)";
    case CS_BAD_NULL_SHAPE: return "shape is NULL although ndim > 0 (R15)";
    case CS_BAD_NEGATIVE_SHAPE: return "shape has a negative extent (R15)";
    case CS_BAD_NULL_STRIDES_V12: return "strides is NULL in a version >= 1.2 tensor with ndim > 0 (R16)";
    case CS_BAD_DTYPE_CODE: return "dtype code is not a DLDataTypeCode (R18)";
    case CS_BAD_DTYPE_BITS: return "dtype bits is not a valid width for its code (R18)";
    case CS_BAD_DTYPE_LANES: return "dtype lanes is 0 (R18)";
    case CS_BAD_DEVICE_TYPE: return "device_type is not a DLDeviceType (R19)";
    case CS_BAD_DEVICE_ID: return "device_id is not 0 for CPU memory (R19)";
    case CS_BAD_VERSION_MAJOR: return "version.major is not 1 in a versioned capsule (R13)";
    case CS_BAD_FLAGS: return "flags has unknown bits (R21)";
    case CS_BAD_MUTATED: return "shape, strides or data changed while the tensor was on loan (R20)";
    case CS_BAD_RENAME: return "the capsule was renamed to a name other than used_dltensor (R7)";
    case CS_BAD_RENAME_VERSION:
        return "the capsule was renamed to the other DLPack version's consumed name (used_dltensor "
               "for a dltensor_versioned capsule, or used_dltensor_versioned for a dltensor one; "
               "R8): its producer's destructor does not see it consumed and releases it";
    case CS_BAD_NULL_DATA: return "data is NULL although the tensor has elements (R17)";
    case CS_BAD_BOOL_BITS: return "bool dtype with bits != 8 (R18)";
    case CS_BAD_HANDLER_NAME: return "the handler capsule is not named 'mem_handler' (R27)";
    case CS_BAD_HANDLER_VERSION: return "the handler version is not 1 (R27)";
    case CS_BAD_HANDLER_NULL_FN: return "the handler has a NULL function (R27)";
    case CS_BAD_HANDLER_UNTERMINATED: return "the handler name is not NUL-terminated (R27)";
    }
    return "malformed";
}

static const char *xentry_name(unsigned e)
{
    switch (e) {
    case CS_XE_ALLOC: return "managed_tensor_allocator";
    case CS_XE_FROM_PY: return "managed_tensor_from_py_object_no_sync";
    case CS_XE_TO_PY: return "managed_tensor_to_py_object_no_sync";
    case CS_XE_VIEW: return "dltensor_from_py_object_no_sync";
    case CS_XE_STREAM: return "current_work_stream";
    case CS_XE_FFI_CALL: return "TVMFFIFunctionCall";
    }
    return "the table";
}

/* An XCHECK finding's words (detail: CS_XC_*; value: the entry in the low
 * byte, the rule's number beside it in the high bytes), into tmp */
static const char *xcheck_text(uint32_t d, uint64_t value, uint64_t obj, char *tmp, size_t n)
{
    const char *e = xentry_name((unsigned)(value & 0xff));
    unsigned long long v = (unsigned long long)(value >> 8);
    unsigned long long p = (unsigned long long)obj;
    switch (d) {
    case CS_XC_RC_NO_ERROR:
        snprintf(tmp, n, "%s returned %lld (failure) without setting a Python exception (R51): "
                 "its caller raises SystemError or loses the error", e, (long long)(int)v);
        break;
    case CS_XC_OK_WITH_ERROR:
        snprintf(tmp, n, "%s returned 0 (success) with a Python exception set (R51): the "
                 "exception surfaces later, at an unrelated line", e);
        break;
    case CS_XC_NO_GIL:
        if (v & CS_NOGIL_FREE_THREADED)
            snprintf(tmp, n, "%s was called without an attached thread state (free-threaded "
                     "build: PyGILState_Check() == 0, R56): its Python-facing entries build and "
                     "read Python objects and must be called from a thread with one attached", e);
        else
            snprintf(tmp, n, "%s was called without the GIL (R56): its Python-facing entries "
                     "build and read Python objects and must be called with the GIL held", e);
        break;
    case CS_XC_SETERROR:
        snprintf(tmp, n, "managed_tensor_allocator %s but called SetError %llu time(s) (R54): "
                 "SetError must be called exactly once when, and only when, it fails",
                 ((v >> 32) & 1) ? "failed" : "succeeded", v & 0xffffffffull);
        break;
    case CS_XC_TO_PY_RELEASED:
        snprintf(tmp, n, "managed_tensor_to_py_object_no_sync ran the deleter of tensor 0x%llx "
                 "and then failed (R52): on failure the caller still owns the tensor and will "
                 "delete it again", p);
        break;
    case CS_XC_NULL_OUT:
        snprintf(tmp, n, "%s returned 0 (success) but gave no tensor (R51)", e);
        break;
    case CS_XC_FFI_ERROR_LOST:
        snprintf(tmp, n, "%s of function 0x%llx, whose arguments were converted through the "
                 "exchange table, failed (returned %lld) with its error raised through the FFI "
                 "error API, and the Python call that made it returned without fetching that "
                 "error (TVMFFIErrorMoveFromRaised) (R51: return code and error state agree, "
                 "judged at the FFI call): the caller overwrote the return code, and the failure "
                 "was silently taken for success", e, p, (long long)(int)v);
        break;
    case CS_XT_VERSION:
        snprintf(tmp, n, "exchange table 0x%llx has version.major %llu, not 1 (R50): capsan does "
                 "not follow its calls", p, v);
        break;
    case CS_XT_NULL_ENTRY:
        snprintf(tmp, n, "exchange table 0x%llx has a NULL %s (R50): only "
                 "dltensor_from_py_object_no_sync may be NULL", p, e);
        break;
    case CS_XT_NOT_STATIC:
        snprintf(tmp, n, "exchange table 0x%llx lies in no loaded object (heap or stack memory, "
                 "R50): consumers cache it per type, so it must live as long as the process", p);
        break;
    case CS_XT_PREV:
        snprintf(tmp, n, "exchange table 0x%llx: prev_api 0x%llx does not point to a table of "
                 "an older version (R50)", p, v);
        break;
    default:
        snprintf(tmp, n, "exchange-API contract broken (code %u)", d);
    }
    return tmp;
}

const char *cs_finding_message(const cs_finding *f, char *buf, size_t n)
{
    if (CS_KIND_IS_ARROW(f->kind))
        return cs_ar_message(f, buf, n);
    const char *t = cs_finding_object_type(f);
    unsigned long long p = (unsigned long long)f->obj;
    switch (f->kind) {
    case CS_KIND_DLPACK_DOUBLE_DELETE:
        /* detail: the finding that made the first release the wrong one */
        if (f->detail == CS_KIND_DLPACK_UNCHECKED_DESTRUCTOR)
            snprintf(buf, n, "deleter of %s 0x%llx called twice: the producer's capsule "
                     "destructor released it although it was consumed "
                     "(dlpack-unchecked-destructor), and now its consumer deletes it", t, p);
        else if (f->detail == CS_KIND_DLPACK_BAD_TENSOR)
            snprintf(buf, n, "deleter of %s 0x%llx called twice: its consumer renamed the capsule "
                     "to the other DLPack version's consumed name (dlpack-bad-tensor), so the "
                     "producer's destructor released it, and now the consumer deletes it", t, p);
        else if (f->detail == CS_KIND_DLPACK_NOT_RENAMED)
            snprintf(buf, n, "deleter of %s 0x%llx called twice: its consumer released it "
                     "without renaming the capsule (dlpack-not-renamed), and now the "
                     "producer's destructor deletes it", t, p);
        else
            snprintf(buf, n, "deleter of %s 0x%llx called twice", t, p);
        break;
    case CS_KIND_DLPACK_UNCHECKED_DESTRUCTOR:
        snprintf(buf, n, "the producer's capsule destructor called the deleter of %s 0x%llx "
                 "although the capsule was consumed (renamed used_*): only the consumer may "
                 "release it; the destructor must check the capsule name", t, p);
        break;
    case CS_KIND_DLPACK_NOT_RENAMED:
        snprintf(buf, n, "the deleter of %s 0x%llx was called while its capsule is still "
                 "unconsumed: the producer's destructor will delete it again (a consumer must "
                 "rename the capsule to used_dltensor when it takes ownership)", t, p);
        break;
    case CS_KIND_DLPACK_RECONSUME:
        snprintf(buf, n, "%s 0x%llx consumed again after it was %s", t, p,
                 f->detail == CS_ST_RELEASED ? "released" : "consumed");
        break;
    case CS_KIND_DLPACK_LEAK:
        if (f->nevents && f->events[0].kind == CS_EV_EXPORT && (f->events[0].aux & CS_DLV_X) &&
            f->detail != CS_LEAK_KILLED) {
            unsigned x = f->events[0].aux;
            snprintf(buf, n, "%s 0x%llx (%llu bytes) %s and its deleter was never called", t, p,
                     (unsigned long long)f->bytes,
                     (x & CS_DLV_XFROM)    ? "was taken with managed_tensor_from_py_object_no_sync "
                                             "(an owning tensor: the caller must delete it)"
                     : (x & CS_DLV_XALLOC) ? "was allocated with managed_tensor_allocator (an "
                                             "owning tensor: the caller must delete it)"
                     : (x & CS_DLV_HANDED) ? "was handed to managed_tensor_to_py_object_no_sync"
                                           : "was given to managed_tensor_to_py_object_no_sync, "
                                             "which failed: its caller still owns it,");
            break;
        }
        switch (f->detail) {
        case CS_LEAK_CONSUMED:
            snprintf(buf, n, "%s 0x%llx (%llu bytes) was consumed but its deleter was never "
                     "called", t, p, (unsigned long long)f->bytes);
            break;
        case CS_LEAK_NULL_DESTRUCTOR:
            snprintf(buf, n, "%s 0x%llx (%llu bytes) leaked: its capsule was created without a "
                     "destructor and died unconsumed", t, p, (unsigned long long)f->bytes);
            break;
        case CS_LEAK_NEVER_CONSUMED:
            snprintf(buf, n, "%s 0x%llx (%llu bytes) was exported and never consumed nor "
                     "released", t, p, (unsigned long long)f->bytes);
            break;
        case CS_LEAK_KILLED:
            snprintf(buf, n, "%s 0x%llx (%llu bytes) was not released when the process was "
                     "killed (no leak verdict: the program never reached its end)", t, p,
                     (unsigned long long)f->bytes);
            break;
        case CS_LEAK_SHUTDOWN:
            snprintf(buf, n, "%s 0x%llx (%llu bytes) was exported and never consumed; its "
                     "capsule lived until interpreter shutdown, when the deleter declined to "
                     "release it (drop unconsumed capsules before exit)", t, p,
                     (unsigned long long)f->bytes);
            break;
        default:
            snprintf(buf, n, "%s 0x%llx (%llu bytes) leaked: its capsule died unconsumed and "
                     "the destructor did not call the deleter", t, p, (unsigned long long)f->bytes);
        }
        break;
    case CS_KIND_LIVE_AT_EXIT:
        if (f->detail == CS_LIVE_KILLED)
            snprintf(buf, n, "%s 0x%llx (%llu bytes) was still allocated when the process was "
                     "killed (no leak verdict)", t, p, (unsigned long long)f->bytes);
        else if (f->nevents && f->events[0].kind == CS_EV_AR_EXPORT)
            snprintf(buf, n, "%s 0x%llx was still %s when the process called _exit(), which "
                     "runs no cleanup: live, not leaked", t, p,
                     f->events[f->nevents - 1].kind == CS_EV_AR_REACHABLE
                         ? "referenced" : "in its capsule (a live Python object)");
        else
            snprintf(buf, n, "%s 0x%llx (%llu bytes) was still referenced when the process "
                     "called _exit(), which runs no cleanup: live, not leaked", t, p,
                     (unsigned long long)f->bytes);
        break;
    case CS_KIND_DLPACK_DATA_FREED:
        snprintf(buf, n, "the memory the data of %s 0x%llx lies in was freed (%s 0x%llx) while "
                 "its consumer still holds the tensor: the consumer now reads freed memory",
                 t, p, f->detail == CS_FREED_PYMEM ? "PyMem_Free" : "free",
                 (unsigned long long)f->value);
        break;
    case CS_KIND_DLPACK_DESTRUCTOR_REENTERED:
        snprintf(buf, n, "the capsule destructor of %s 0x%llx was entered again for the capsule "
                 "it is destroying: it brought the dying capsule back to life (for example "
                 "PyErr_WriteUnraisable(self) on a name it does not expect, R4) and the capsule "
                 "dies again inside it, a recursion that ends in SIGSEGV", t, p);
        break;
    case CS_KIND_DLPACK_ERROR_CLOBBERED:
        snprintf(buf, n, "the %s of %s 0x%llx %s the Python error indicator (R5): %s",
                 f->value ? "capsule destructor" : "deleter", t, p,
                 f->detail == CS_ERRST_CLEARED    ? "cleared a pending exception from"
                 : f->detail == CS_ERRST_REPLACED ? "replaced a pending exception in"
                                                  : "returned with a new exception left in",
                 f->detail == CS_ERRST_LEFT
                     ? "it surfaces later, at an unrelated line, or as SystemError"
                     : "the caller's exception is lost (its caller may raise SystemError); save "
                       "it with PyErr_Fetch and restore it with PyErr_Restore");
        break;
    case CS_KIND_DLPACK_STALE_VIEW:
        if (f->detail & CS_FREED_KEPT) {
            snprintf(buf, n, "the memory the non-owning view 0x%llx "
                     "(dltensor_from_py_object_no_sync) points into was freed (%s 0x%llx) after "
                     "its call returned, while the DLTensor it filled, kept in static or heap "
                     "memory, still describes it: a view is valid only while its call lasts; a "
                     "later read of the kept view reads freed memory (not seen by capsan: a "
                     "warning)", p, (f->detail & 0xf) == CS_FREED_PYMEM ? "PyMem_Free" : "free",
                     (unsigned long long)f->value);
            break;
        }
        snprintf(buf, n, "the memory the non-owning view 0x%llx (dltensor_from_py_object_no_sync) "
                 "points into was freed (%s 0x%llx) while its caller still uses the view: the view "
                 "is valid only while its Python object lives and the call lasts", p,
                 f->detail == CS_FREED_PYMEM ? "PyMem_Free" : "free", (unsigned long long)f->value);
        break;
    case CS_KIND_DLPACK_EXCHANGE_CONTRACT:
        xcheck_text(f->detail, f->value, f->obj, buf, n);
        break;
    case CS_KIND_DLPACK_BAD_EXCHANGE_TABLE:
        xcheck_text(f->detail, f->value, f->obj, buf, n);
        break;
    case CS_KIND_DLPACK_NULL_DELETER:
        snprintf(buf, n, "a consumer called the NULL deleter of %s 0x%llx: a producer may "
                 "export a NULL deleter, and consumers must check it before calling (R10)",
                 t, p);
        break;
    case CS_KIND_DLPACK_BAD_TENSOR:
        /* a missing pointer or a change has no offending value to show */
        if (f->detail == CS_BAD_NULL_SHAPE || f->detail == CS_BAD_NULL_STRIDES_V12 ||
            f->detail == CS_BAD_NULL_DATA || f->detail == CS_BAD_MUTATED || f->detail == CS_BAD_RENAME ||
            f->detail == CS_BAD_UNREADABLE || f->detail == CS_BAD_UNREADABLE_SHAPE ||
            f->detail == CS_BAD_RENAME_VERSION)
            snprintf(buf, n, "%s 0x%llx: %s", t, p, bad_text(f->detail));
        else
            snprintf(buf, n, "%s 0x%llx: %s (value %lld)", t, p, bad_text(f->detail),
                     (long long)f->value);
        break;
    case CS_KIND_DLPACK_BYTE_OFFSET_IGNORED:
        if (f->detail == 1)
            snprintf(buf, n, "%s 0x%llx has byte_offset %llu, but its consumer ignored it: it "
                     "re-exported the same buffer starting at data, %llu bytes before the first "
                     "element, so whoever reads the new tensor gets the wrong elements", t, p,
                     (unsigned long long)f->value, (unsigned long long)f->value);
        else if (f->detail == 2)
            snprintf(buf, n, "%s 0x%llx has byte_offset %llu, but its consumer ignored it: the "
                     "array it made of it starts at data, %llu bytes before the first element "
                     "(its __array_interface__ says so), so it reads the wrong elements", t, p,
                     (unsigned long long)f->value, (unsigned long long)f->value);
        else
            snprintf(buf, n, "%s 0x%llx has byte_offset %llu but was consumed by a consumer that "
                     "ignores byte_offset (torch): it reads the wrong elements", t, p,
                     (unsigned long long)f->value);
        break;
    case CS_KIND_CAPSULE_NO_GIL:
        if (nogil_ft(f))
            snprintf(buf, n, "a PyCapsule function was called without an attached thread state "
                     "(free-threaded build: PyGILState_Check() == 0): attach one with "
                     "PyGILState_Ensure first");
        else
            snprintf(buf, n, "a PyCapsule function was called without holding the GIL "
                     "(PyGILState_Check() == 0): take it with PyGILState_Ensure first");
        break;
    case CS_KIND_NUMPY_HANDLER_NO_GIL:
        if (nogil_ft(f))
            snprintf(buf, n, "a NumPy allocation or free went through the memory handler without "
                     "an attached thread state (free-threaded build: PyGILState_Check() == 0; "
                     "call site 0x%llx): numpy calls handlers from a thread with one attached "
                     "(R33)", p);
        else
            snprintf(buf, n, "a NumPy allocation or free went through the memory handler without "
                     "the GIL (call site 0x%llx): numpy's default handler expects it held (R33)", p);
        break;
    case CS_KIND_DLPACK_DELETER_NO_GIL:
        if (nogil_ft(f))
            snprintf(buf, n, "a DLPack deleter called without an attached thread state "
                     "(free-threaded build: PyGILState_Check() == 0) used the Python C API "
                     "without attaching one with PyGILState_Ensure (R12)");
        else
            snprintf(buf, n, "a DLPack deleter called without the GIL (as torch calls foreign "
                     "deleters) used the Python C API without PyGILState_Ensure (R12)");
        break;
    case CS_KIND_DLPACK_DEVICE_MISMATCH:
        snprintf(buf, n, "%s 0x%llx exports data 0x%llx as CPU memory, but the handler that "
                 "allocated it declared DLPack device type %u: consumers will treat it as "
                 "plain host memory", t, p, (unsigned long long)f->value, f->detail);
        break;
    case CS_KIND_NUMPY_LEAK:
        snprintf(buf, n, "%llu bytes of NumPy data at 0x%llx allocated and never freed",
                 (unsigned long long)f->bytes, p);
        break;
    case CS_KIND_NUMPY_DOUBLE_FREE:
        snprintf(buf, n, "NumPy data 0x%llx freed twice", p);
        break;
    case CS_KIND_NUMPY_FOREIGN_FREE:
        snprintf(buf, n, "NumPy freed 0x%llx, which no memory handler allocated: an array was "
                 "given NPY_ARRAY_OWNDATA on foreign memory (hand it over through a PyCapsule "
                 "base object instead)", p);
        break;
    case CS_KIND_NUMPY_STALE_HANDLER: {
        unsigned why = f->detail & ~(unsigned)CS_STALE_AT_DEATH;
        const char *whose =
            why == CS_STALE_CHANGED ? "whose struct changed or was freed since it was "
                                      "installed (a handler must be immortal)"
            : why == CS_STALE_UNLOADED ? "whose functions are no longer in a loaded "
                                         "object (dlclose)"
            : why == CS_STALE_CTX_FREED ? "whose ctx was freed while its blocks were "
                                          "alive (free() of allocator.ctx)"
            : why == CS_STALE_REPOINTED ? "whose ctx or functions were re-pointed in "
                                          "place since it allocated the block: another "
                                          "pool frees it (a handler must be immortal)"
                                        : "which is not the handler that allocated it";
        if (f->detail & CS_STALE_AT_DEATH) /* told when the handler died, before any free */
            snprintf(buf, n, "%llu bytes of NumPy data at 0x%llx outlive memory handler 0x%llx, "
                     "%s: numpy will free them through it", (unsigned long long)f->bytes, p,
                     (unsigned long long)f->value, whose);
        else
            snprintf(buf, n, "%llu bytes of NumPy data at 0x%llx freed through memory handler "
                     "0x%llx, %s", (unsigned long long)f->bytes, p,
                     (unsigned long long)f->value, whose);
        break;
    }
    case CS_KIND_NUMPY_BAD_HANDLER:
        snprintf(buf, n, "invalid NumPy memory handler at 0x%llx: %s", p, bad_text(f->detail));
        break;
    default:
        snprintf(buf, n, "%s 0x%llx", cs_kind_name(f->kind), p);
    }
    return buf;
}

/* CS_WHERE_* in words, and as JSON names it */
static const struct {
    const char *name, *text;
} wheres[] = {
    [CS_WHERE_DATA] = {"data", "a loaded object's static data"},
    [CS_WHERE_HEAP] = {"heap", "the heap"},
    [CS_WHERE_STACK] = {"stack", "the main thread's stack"},
    [CS_WHERE_ANON] = {"anonymous", "anonymous memory (the interpreter's object arenas, large "
                                    "malloc blocks, threads' stacks)"},
    [CS_WHERE_THREAD] = {"thread", "a Python thread still running at exit"},
    [CS_WHERE_THREAD_FRAMES] = {"thread-frames", "the frames of a Python thread still running at exit"},
    [CS_WHERE_ARROW_BUFFER] = {"arrow-buffer", "a pyarrow buffer a module reached at exit"},
    [CS_WHERE_MODULE_KEPT] = {"module-globals", "a module's globals, never cleared"},
    [CS_WHERE_PY_REACHED] = {"python-objects", "Python objects that outlived finalization"},
};

const char *cs_where_text(unsigned region)
{
    return region < sizeof wheres / sizeof wheres[0] ? wheres[region].text : NULL;
}

const char *cs_where_name(unsigned region)
{
    return region < sizeof wheres / sizeof wheres[0] ? wheres[region].name : NULL;
}

const char *cs_end_unchecked_why(int how)
{
    switch (how) {
    case CS_END_API_EXIT:
        return "API mode: leaks judged in capsan.trace() scopes, not at exit";
    case CS_END_STOPPED_EXIT:
        return "after capsan.stop(): releases since were not seen, no leak check";
    default:
        return NULL;
    }
}
