/* st_atexit: a consumer that keeps DLPack tensors in static storage and
 * releases them only after Py_Finalize, from C exit code that Python does
 * not know about (no Py_AtExit):
 *
 *   hold(cap, when)   consume cap ("dltensor" or "dltensor_versioned":
 *                     rename it to used_*), and keep the managed tensor in
 *                     a static table (.bss). when="atexit": released by a
 *                     C atexit() handler registered at import; "dtor":
 *                     released by this object's ELF destructor (run by
 *                     _dl_fini, after every atexit handler)
 *   held()            (atexit count, dtor count)
 *   set_log(path)     where the exit code writes what it released, as
 *                     "atexit N\n" / "dtor N\n" lines (plain write(2): the
 *                     interpreter is gone by then)
 *
 * Releasing a consumed tensor late is correct DLPack: every tensor kept
 * here is released exactly once, none is leaked. C++ extensions do this
 * when a static container of tensors is destroyed at exit (numpy's
 * deleter checks Py_IsInitialized() for that case, numpy PR 22510).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include "../fixtures/fx_module.h"
#include <dlpack/dlpack.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../fixtures/fx_dlpack.h"

#define MAXHELD 65536

typedef struct {
    void *mt;
    int versioned;
} held_t;

/* static data on purpose: the tensors are reachable from here until the end */
static held_t held_atexit[MAXHELD], held_dtor[MAXHELD];
static long n_atexit, n_dtor;
static char log_path[1024];
static PyThread_type_lock mu;

static void release(const char *tag, held_t *tab, long *n)
{
    long done = 0;
    for (long i = 0; i < *n; i++) {
        if (tab[i].versioned) {
            FxManagedTensorVersioned *v = tab[i].mt;
            if (v->deleter)
                v->deleter(v);
        } else {
            DLManagedTensor *m = tab[i].mt;
            if (m->deleter)
                m->deleter(m);
        }
        tab[i].mt = NULL;
        done++;
    }
    *n = 0;
    if (!log_path[0])
        return;
    int fd = open(log_path, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
    if (fd < 0)
        return;
    char line[64];
    int len = snprintf(line, sizeof line, "%s %ld\n", tag, done);
    if (len > 0 && write(fd, line, (size_t)len) != len) {
        /* nothing to do: the test sees the short file */
    }
    close(fd);
}

static void at_exit_release(void)
{
    release("atexit", held_atexit, &n_atexit);
}

__attribute__((destructor)) static void dtor_release(void)
{
    release("dtor", held_dtor, &n_dtor);
}

static PyObject *hold(PyObject *self, PyObject *args)
{
    (void)self;
    PyObject *cap;
    const char *when;
    if (!PyArg_ParseTuple(args, "Os", &cap, &when))
        return NULL;
    int to_dtor;
    if (strcmp(when, "atexit") == 0)
        to_dtor = 0;
    else if (strcmp(when, "dtor") == 0)
        to_dtor = 1;
    else
        return PyErr_Format(PyExc_ValueError, "when must be atexit or dtor, not %s", when);
    int versioned = PyCapsule_IsValid(cap, "dltensor_versioned");
    if (!versioned && !PyCapsule_IsValid(cap, "dltensor"))
        return PyErr_Format(PyExc_ValueError, "not an unconsumed DLPack capsule");
    const char *name = versioned ? "dltensor_versioned" : "dltensor";
    void *mt = PyCapsule_GetPointer(cap, name);
    if (!mt)
        return NULL;
    PyThread_acquire_lock(mu, WAIT_LOCK);
    long *n = to_dtor ? &n_dtor : &n_atexit;
    if (*n >= MAXHELD) {
        PyThread_release_lock(mu);
        return PyErr_Format(PyExc_OverflowError, "more than %d tensors held", MAXHELD);
    }
    if (PyCapsule_SetName(cap, versioned ? "used_dltensor_versioned" : "used_dltensor") < 0) {
        PyThread_release_lock(mu);
        return NULL;
    }
    held_t *tab = to_dtor ? held_dtor : held_atexit;
    tab[*n].mt = mt;
    tab[*n].versioned = versioned;
    (*n)++;
    PyThread_release_lock(mu);
    Py_RETURN_NONE;
}

static PyObject *held(PyObject *self, PyObject *noargs)
{
    (void)self;
    (void)noargs;
    return Py_BuildValue("(ll)", n_atexit, n_dtor);
}

static PyObject *set_log(PyObject *self, PyObject *args)
{
    (void)self;
    const char *p;
    if (!PyArg_ParseTuple(args, "s", &p))
        return NULL;
    snprintf(log_path, sizeof log_path, "%s", p);
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"hold", hold, METH_VARARGS, "hold(cap, when): consume and keep until after Py_Finalize"},
    {"held", held, METH_NOARGS, "(atexit count, dtor count)"},
    {"set_log", set_log, METH_VARARGS, "set_log(path): the exit code's release log"},
    {NULL, NULL, 0, NULL}};

static struct PyModuleDef moddef = {PyModuleDef_HEAD_INIT, "st_atexit", NULL, -1, methods,
                                    NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit_st_atexit(void)
{
    mu = PyThread_allocate_lock();
    if (!mu)
        return PyErr_NoMemory();
    if (atexit(at_exit_release) != 0)
        return PyErr_Format(PyExc_RuntimeError, "atexit() refused the handler");
    return fx_module_nogil(PyModule_Create(&moddef));
}
