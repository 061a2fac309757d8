/* The Python C-API as the runtime sees it: resolved with dlsym at start-up,
 * never linked, so libcapsan.so loads into any process (a shell, gcc) and
 * works with static and shared libpython alike. cs_py.ok is 0 when the
 * host is not a CPython process. */
#ifndef CAPSAN_PYAPI_H
#define CAPSAN_PYAPI_H

#include <stddef.h>
#include <stdint.h>

#include "pyversion.h"

typedef struct _object PyObject_;
typedef void (*cs_capsule_dtor)(PyObject_ *);

typedef struct cs_pyapi {
    int ok;             /* PyCapsule_New and friends were found */
    int major, minor;   /* the interpreter's version */
    /* its layouts (pyversion.h); NULL for a version capsan cannot prove:
     * stacks are then native only, and layout_why says what is missing */
    const cs_pylayout *layout;
    const char *layout_why;
    /* PyObject.ob_type: 8, or 24 on a free-threaded build, proven on None
     * whatever the version (0: not proven; no object is walked then) */
    size_t ob_type_off;
    /* a free-threaded build (ob_type at 24): the GIL kinds' rule is an
     * attached thread state there, and their words say so */
    int free_threaded;
    const void *Code_Type; /* &PyCode_Type */
    /* capsule originals (taken before any slot is patched) */
    PyObject_ *(*Capsule_New)(void *, const char *, cs_capsule_dtor);
    int (*Capsule_SetName)(PyObject_ *, const char *);
    void *(*Capsule_GetPointer)(PyObject_ *, const char *);
    int (*Capsule_IsValid)(PyObject_ *, const char *);
    int (*Capsule_SetDestructor)(PyObject_ *, cs_capsule_dtor);
    cs_capsule_dtor (*Capsule_GetDestructor)(PyObject_ *);
    int (*Capsule_SetPointer)(PyObject_ *, void *);
    const char *(*Capsule_GetName)(PyObject_ *);
    /* interpreter state */
    int (*IsInitialized)(void);
    int (*GILState_Check)(void);
    void *(*ThreadState_UncheckedGet)(void);
    void *(*GILState_GetThisThreadState)(void);
    int (*Code_Addr2Line)(void *code, int lasti);
    const char *(*Unicode_AsUTF8)(PyObject_ *);
    void (*Err_Fetch)(PyObject_ **, PyObject_ **, PyObject_ **);
    void (*Err_Restore)(PyObject_ *, PyObject_ *, PyObject_ *);
    PyObject_ *(*Err_Occurred)(void); /* GIL held */
    void (*Err_WriteUnraisable)(PyObject_ *);
    void (*IncRef)(PyObject_ *);
    void (*DecRef)(PyObject_ *);
    /* used by numpy/: the NEP 49 channel and numpy's API table */
    int (*TraceMalloc_Track)(unsigned int, uintptr_t, size_t);
    int (*TraceMalloc_Untrack)(unsigned int, uintptr_t);
    PyObject_ *(*ContextVar_New)(const char *, PyObject_ *);
    int (*ContextVar_Set)(PyObject_ *, PyObject_ *);
    PyObject_ *(*Import_ImportModule)(const char *);
    PyObject_ *(*Object_GetAttrString)(PyObject_ *, const char *);
    void (*Err_SetString)(PyObject_ *, const char *);
    PyObject_ **Exc_RuntimeError;
    /* the walk of what Python still reaches (pyreach.c, exitroots.c) */
    int (*Type_IsSubtype)(const void *, const void *);
    const void *Capsule_Type; /* &PyCapsule_Type */
    PyObject_ *(*Object_CallFunctionObjArgs)(PyObject_ *, ...);
    PyObject_ *(*CFunction_NewEx)(void *def, PyObject_ *self, PyObject_ *module);
    int (*AddPendingCall)(int (*)(void *), void *);
    unsigned long (*Thread_get_thread_ident)(void);
    int (*Dict_Next)(PyObject_ *, intptr_t *, PyObject_ **, PyObject_ **);
    unsigned long (*Long_AsUnsignedLong)(PyObject_ *);
    PyObject_ *(*Sequence_List)(PyObject_ *);
    PyObject_ *(*List_New)(intptr_t);
    int (*List_Append)(PyObject_ *, PyObject_ *);
    void (*Err_Clear)(void);
    PyObject_ *None_; /* &_Py_NoneStruct */
    PyObject_ *True_; /* &_Py_TrueStruct */
    PyObject_ *(*Import_GetModuleDict)(void);
    PyObject_ *(*Dict_GetItemString)(PyObject_ *, const char *);
    int (*Dict_SetItemString)(PyObject_ *, const char *, PyObject_ *);
    const void *Module_Type; /* &PyModule_Type */
    PyObject_ *(*Module_GetDict)(PyObject_ *);
    intptr_t (*List_Size)(PyObject_ *);
    PyObject_ *(*List_GetItem)(PyObject_ *, intptr_t);
    PyObject_ *(*Eval_GetFrame)(void); /* a Python-level consumer's frame (consumer_view.c) */
} cs_pyapi;

extern cs_pyapi cs_py;

/* Resolve everything; returns cs_py.ok. Safe to call again after a dlopen
 * (an embedding program may load libpython late). */
int cs_pyapi_init(void);

/* Py_XDECREF */
static inline void cs_py_xdecref(PyObject_ *o)
{
    if (o)
        cs_py.DecRef(o);
}
/* obj.name(): a new reference, or NULL with an exception set. GIL held. */
PyObject_ *cs_py_call_method0(PyObject_ *obj, const char *name);
/* sys.modules[name] (borrowed), or NULL: a lookup, never an import (no
 * import hook runs). GIL held. */
PyObject_ *cs_py_module(const char *name);

/* Direct reads of _PyRuntime where the version has the current thread
 * state there (3.10, 3.11; gil.c), set once they agree with libpython;
 * tstate is NULL when the shortcut is off. */
typedef struct cs_pyfast {
    void *const volatile *tstate;    /* &_PyRuntime.gilstate.tstate_current */
    const volatile int *initialized; /* &_PyRuntime.initialized */
    size_t tid_off;                  /* offsetof(PyThreadState, thread_id) */
} cs_pyfast;
extern cs_pyfast cs_pyf;
/* this thread's checks made both ways so far (gil.c) */
extern __thread unsigned cs_gil_checks __attribute__((tls_model("initial-exec")));
#define CS_GIL_CHECKS 32
int cs_gil_held_slow(void);

/* PyGILState_Check() without a call: the current PyThreadState is this
 * thread's. cs_py.ok must be true. */
static inline int cs_gil_held(void)
{
    void *const volatile *slot = __atomic_load_n(&cs_pyf.tstate, __ATOMIC_RELAXED);
    if (__builtin_expect(slot && cs_gil_checks >= CS_GIL_CHECKS, 1)) {
        const char *ts = *slot;
        return ts && *(const unsigned long *)(ts + cs_pyf.tid_off) ==
                         (unsigned long)__builtin_thread_pointer();
    }
    return cs_gil_held_slow();
}

/* Py_IsInitialized(); cs_py.ok must be true. */
static inline int cs_py_live(void)
{
    const volatile int *p = cs_pyf.initialized;
    return p ? *p : cs_py.IsInitialized();
}

/* The calling thread holds the GIL (0 outside Python). */
static inline int cs_py_has_gil(void)
{
    return cs_py.ok && cs_py_live() && cs_gil_held();
}

#endif
