/* st_reload: a DLPack producer and consumer that is loaded with ctypes
 * (ctypes.PyDLL: called with the GIL held) and unloaded again with
 * _ctypes.dlclose. The Makefile builds it twice from this one source,
 * libst_reload_a.so (ST_TAG 'A') and libst_reload_b.so ('B'): the two
 * have the same code and the same layout, so that after a dlclose of one
 * the loader can map the other at the same address. Not a Python module:
 * it has no PyInit (Python would never unload one).
 *
 *   PyObject *rl_export(Py_ssize_t n)   a "dltensor" capsule of a fresh
 *            float32 tensor 0..n-1; this library's destructor (it releases
 *            only an unconsumed capsule) and deleter
 *   PyObject *rl_consume(PyObject *cap) rename, sum, release: a correct
 *            consumer of any "dltensor" capsule (numpy's, torch's, ours)
 *   PyObject *rl_leak(Py_ssize_t n)     export a tensor and consume it
 *            without ever calling its deleter (a real leak); returns the sum
 *   long rl_live(void)                  tensors of this library not yet released
 *   int rl_tag(void)                    'A' or 'B'
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <dlpack/dlpack.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>

#ifndef ST_TAG
#error "build with -DST_TAG=65 or 66"
#endif

#define API __attribute__((visibility("default")))

typedef struct {
    DLManagedTensor mt;
    int64_t shape[1];
    int64_t strides[1];
    float data[];
} Tensor;

static atomic_long live;

static void rl_deleter(DLManagedTensor *self)
{
    atomic_fetch_sub(&live, 1);
    free(self->manager_ctx);
}

static void rl_dtor(PyObject *cap)
{
    PyObject *t, *v, *tb;
    PyErr_Fetch(&t, &v, &tb);
    if (PyCapsule_IsValid(cap, "dltensor")) {
        DLManagedTensor *mt = PyCapsule_GetPointer(cap, "dltensor");
        if (mt && mt->deleter)
            mt->deleter(mt);
    }
    PyErr_Restore(t, v, tb);
}

static DLManagedTensor *new_tensor(Py_ssize_t n)
{
    if (n < 0 || n > (1 << 24)) {
        PyErr_SetString(PyExc_ValueError, "n out of range");
        return NULL;
    }
    Tensor *t = malloc(sizeof *t + (size_t)(n ? n : 1) * sizeof(float));
    if (!t) {
        PyErr_NoMemory();
        return NULL;
    }
    for (Py_ssize_t i = 0; i < n; i++)
        t->data[i] = (float)i;
    t->shape[0] = n;
    t->strides[0] = 1;
    t->mt = (DLManagedTensor){
        .dl_tensor = {.data = t->data, .device = {kDLCPU, 0}, .ndim = 1,
                      .dtype = {kDLFloat, 32, 1}, .shape = t->shape, .strides = t->strides},
        .manager_ctx = t,
        .deleter = rl_deleter};
    atomic_fetch_add(&live, 1);
    return &t->mt;
}

API PyObject *rl_export(Py_ssize_t n)
{
    DLManagedTensor *mt = new_tensor(n);
    if (!mt)
        return NULL;
    PyObject *cap = PyCapsule_New(mt, "dltensor", rl_dtor);
    if (!cap)
        rl_deleter(mt);
    return cap;
}

static double sum(const DLTensor *t)
{
    double s = 0;
    if (t->ndim != 1 || t->dtype.lanes != 1)
        return -1;
    int64_t stride = t->strides ? t->strides[0] : 1;
    const char *base = (const char *)t->data + t->byte_offset;
    for (int64_t i = 0; i < t->shape[0]; i++) {
        const char *p = base + i * stride * (t->dtype.bits / 8);
        if (t->dtype.code == kDLFloat && t->dtype.bits == 32)
            s += *(const float *)p;
        else if (t->dtype.code == kDLFloat && t->dtype.bits == 64)
            s += *(const double *)p;
        else if (t->dtype.code == kDLInt && t->dtype.bits == 64)
            s += (double)*(const int64_t *)p;
        else
            return -1;
    }
    return s;
}

API PyObject *rl_consume(PyObject *cap)
{
    DLManagedTensor *mt = PyCapsule_GetPointer(cap, "dltensor");
    if (!mt || PyCapsule_SetName(cap, "used_dltensor") < 0)
        return NULL;
    double s = sum(&mt->dl_tensor);
    if (mt->deleter)
        mt->deleter(mt);
    return PyFloat_FromDouble(s);
}

API PyObject *rl_leak(Py_ssize_t n)
{
    PyObject *cap = rl_export(n);
    if (!cap)
        return NULL;
    DLManagedTensor *mt = PyCapsule_GetPointer(cap, "dltensor");
    if (!mt || PyCapsule_SetName(cap, "used_dltensor") < 0) {
        Py_DECREF(cap);
        return NULL;
    }
    double s = sum(&mt->dl_tensor);
    Py_DECREF(cap); /* BUG: consumed, and its deleter is never called */
    return PyFloat_FromDouble(s);
}

API long rl_live(void)
{
    return atomic_load(&live);
}

API int rl_tag(void)
{
    return ST_TAG;
}
