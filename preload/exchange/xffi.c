/* tvm-ffi calls around exchange conversions (see xffi.h).
 *
 * The hooks stand in for tvm-ffi's C API in every object that calls it
 * (its Cython core, kernel libraries): the error API's raise and fetch
 * keep one bit a thread, and TVMFFIFunctionCall notes a failure that left
 * its error raised after table conversions, with its stack and Python
 * position. The failure is lost when its Python call returned with the
 * error still raised: judged at the thread's next FFI call, raise or
 * fetch, which come after that return, and, for a lost call that was the
 * thread's last, at its exit or the process's (cs_xffi_end): a program
 * whose failed call returned None often makes no other. libtvm_ffi.so is
 * loaded RTLD_GLOBAL by tvm_ffi, so the originals are the global scope's. */
#include "xffi.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stdint.h>

#include "pyapi.h"
#include "runtime.h"
#include "stack.h"

__thread unsigned cs_xconv __attribute__((tls_model("initial-exec")));

static __thread struct {
    int raised;          /* an FFI error is raised and not fetched */
    unsigned conv_seen;  /* cs_xconv when the last FFI call returned */
    int pending;         /* a failed call's error may be lost: */
    int rc;
    void *func;
    uint32_t stack;
    cs_py_pos pos;
} ffi __attribute__((tls_model("initial-exec")));

typedef int (*call_fn)(void *, void *, int32_t, void *);
typedef void (*raise_fn)(void *);
typedef void (*raise_str_fn)(const char *, const char *);
typedef void (*raise_parts_fn)(const char *, const char **, int32_t);
typedef void (*fetch_fn)(void *);

/* The original: the global scope's (tvm_ffi loads libtvm_ffi.so
 * RTLD_GLOBAL), else what the calling object's own dependencies bind it
 * to (a kernel library linked to it, loaded RTLD_LOCAL). */
static void *real(const char *name, void **cache, const void *caller)
{
    void *p = __atomic_load_n(cache, __ATOMIC_ACQUIRE);
    if (p)
        return p;
    p = dlsym(RTLD_DEFAULT, name);
    Dl_info di;
    if (!p && dladdr(caller, &di) && di.dli_fname) {
        void *h = dlopen(di.dli_fname, RTLD_NOLOAD | RTLD_LAZY);
        if (h) {
            p = dlsym(h, name);
            dlclose(h);
        }
    }
    __atomic_store_n(cache, p, __ATOMIC_RELEASE);
    return p;
}
#define REAL(type, name)                                                                   \
    ({                                                                                     \
        static void *cache_;                                                               \
        (type) real(name, &cache_, __builtin_return_address(0));                           \
    })

static int gil_now(void)
{
    return cs_py_live() && cs_gil_held();
}

static void lost(void)
{
    ffi.pending = 0;
    cs_event ev = {.kind = CS_EV_XCHECK, .obj = (uint64_t)(uintptr_t)ffi.func,
                   .aux = CS_XC_FFI_ERROR_LOST, .a = (uint64_t)(int64_t)ffi.rc,
                   .b = (uint64_t)(uint32_t)ffi.rc, .extra = CS_XE_FFI_CALL, .stack = ffi.stack};
    cs_emit(&ev, 0, NULL, NULL);
}

/* a noted failure whose Python call has returned with its error raised */
static void judge_pending(void)
{
    if (!ffi.pending)
        return;
    if (!ffi.raised) {
        ffi.pending = 0;
        return;
    }
    if (cs_stack_py_within(gil_now(), &ffi.pos))
        return; /* its call still runs: the error may yet be fetched */
    lost();
}

/* A thread that ends with a noted failure never fetched lost it, unless
 * the interpreter's finalization ended it (a daemon thread taking the GIL
 * back after its call): it still has its thread state then, and its call
 * never returned to Python. */
static pthread_key_t exit_key;
static pthread_once_t exit_once = PTHREAD_ONCE_INIT;

static void thread_gone(void *unused)
{
    (void)unused;
    int ended_by_finalization = cs_py.ok && !cs_py_live() && cs_py.GILState_GetThisThreadState &&
                                cs_py.GILState_GetThisThreadState() != NULL;
    if (ffi.pending && ffi.raised && cs_recording && !ended_by_finalization)
        lost();
    ffi.pending = 0;
}

static void exit_key_make(void)
{
    if (pthread_key_create(&exit_key, thread_gone) != 0)
        exit_key = (pthread_key_t)-1; /* no thread-exit verdict: the process's still comes */
}

void cs_xffi_end(void)
{
    judge_pending();
}

static int hook_call(void *func, void *args, int32_t n, void *result)
{
    call_fn fn = REAL(call_fn, "TVMFFIFunctionCall");
    if (!cs_recording)
        return fn(func, args, n, result);
    judge_pending();
    int rc = fn(func, args, n, result);
    unsigned conv = cs_xconv;
    if (rc != 0 && ffi.raised && conv != ffi.conv_seen && !ffi.pending) {
        /* the rare path: where it failed, for the finding if it is lost */
        cs_py_pos pos;
        if (cs_stack_py_pos(gil_now(), &pos)) {
            ffi.pending = 1;
            ffi.rc = rc;
            ffi.func = func;
            ffi.pos = pos;
            ffi.stack = cs_stack_now(1, CS_EV_XCHECK);
            pthread_once(&exit_once, exit_key_make);
            if (exit_key != (pthread_key_t)-1)
                pthread_setspecific(exit_key, &ffi); /* non-NULL: thread_gone runs */
        }
    }
    ffi.conv_seen = conv;
    return rc;
}

static void hook_raise(void *err)
{
    judge_pending();
    ffi.raised = 1;
    REAL(raise_fn, "TVMFFIErrorSetRaised")(err);
}

static void hook_raise_str(const char *kind, const char *msg)
{
    judge_pending();
    ffi.raised = 1;
    REAL(raise_str_fn, "TVMFFIErrorSetRaisedFromCStr")(kind, msg);
}

static void hook_raise_parts(const char *kind, const char **parts, int32_t n)
{
    judge_pending();
    ffi.raised = 1;
    REAL(raise_parts_fn, "TVMFFIErrorSetRaisedFromCStrParts")(kind, parts, n);
}

static void hook_fetch(void *out)
{
    judge_pending(); /* a fetch after its call returned: the error surfaced elsewhere */
    ffi.raised = 0;
    ffi.pending = 0;
    REAL(fetch_fn, "TVMFFIErrorMoveFromRaised")(out);
}

const cs_hook cs_xffi_hooks[] = {
    {"TVMFFIFunctionCall", (void *)hook_call, NULL},
    {"TVMFFIErrorSetRaised", (void *)hook_raise, NULL},
    {"TVMFFIErrorSetRaisedFromCStr", (void *)hook_raise_str, NULL},
    {"TVMFFIErrorSetRaisedFromCStrParts", (void *)hook_raise_parts, NULL},
    {"TVMFFIErrorMoveFromRaised", (void *)hook_fetch, NULL},
};
const int cs_xffi_nhooks = sizeof cs_xffi_hooks / sizeof cs_xffi_hooks[0];
