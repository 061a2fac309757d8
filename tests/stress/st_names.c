/* st_names: capsules whose names end exactly at the end of a mapped page,
 * the next page PROT_NONE (two pages mmap'd, the second mprotect'd).
 *
 *   make(name, terminated=False, tensor=False)
 *       a capsule named `name` (bytes). terminated=False: the last byte of
 *       the name is the last byte of the page, with no NUL after it;
 *       terminated=True: the NUL is the last byte of the page. tensor=True:
 *       the pointer is a fresh 1-d float32 DLManagedTensor (0..n-1, n=4)
 *       with a deleter that frees it; else a plain struct of this module's.
 *       The destructor never compares names (strcmp on an unterminated
 *       name would fault): it calls the deleter only when the capsule
 *       still has the terminated name "dltensor" it was made with (the
 *       DLPack producer's rule), else frees a tensor nobody took itself
 *       (it was never on loan: the name was no DLPack name); then it
 *       unmaps the pages of every name the capsule had (CPython allows a
 *       name to be freed in the destructor).
 *   rename(cap, name, terminated=False)
 *       PyCapsule_SetName to a guarded name (unmapped with the capsule)
 *   query(cap, name)
 *       PyCapsule_GetPointer and PyCapsule_IsValid asked with an
 *       unterminated guarded name; the caller picks one that differs from
 *       the capsule's name within the mapped bytes (CPython's strcmp would
 *       fault otherwise). Returns (pointer returned, is valid).
 *   live()   guarded pages still mapped, tensors still allocated
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include "../fixtures/fx_module.h"
#include <dlpack/dlpack.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#define MAXNAMES 8

typedef struct {
    DLManagedTensor mt;
    int64_t shape[1];
    int64_t strides[1];
    float data[4];
} Tensor;

typedef struct {
    void *pointer;       /* what the capsule holds */
    int is_tensor;
    const char *made_as; /* the name it was made with, if terminated "dltensor" */
    char *pages[MAXNAMES];
    int npages;
} Ctx;

static atomic_long live_pages, live_tensors;
static long pagesz;
static int dummy_struct;

static void tensor_deleter(DLManagedTensor *self)
{
    atomic_fetch_sub(&live_tensors, 1);
    free(self);
}

static Tensor *new_tensor(void)
{
    Tensor *t = calloc(1, sizeof *t);
    if (!t)
        return NULL;
    for (int i = 0; i < 4; i++)
        t->data[i] = (float)i;
    t->shape[0] = 4;
    t->strides[0] = 1;
    t->mt.dl_tensor.data = t->data;
    t->mt.dl_tensor.device.device_type = kDLCPU;
    t->mt.dl_tensor.ndim = 1;
    t->mt.dl_tensor.dtype.code = kDLFloat;
    t->mt.dl_tensor.dtype.bits = 32;
    t->mt.dl_tensor.dtype.lanes = 1;
    t->mt.dl_tensor.shape = t->shape;
    t->mt.dl_tensor.strides = t->strides;
    t->mt.manager_ctx = t;
    t->mt.deleter = tensor_deleter;
    atomic_fetch_add(&live_tensors, 1);
    return t;
}

/* Two pages, the second PROT_NONE; the name's last byte (terminated: its
 * NUL) is the last byte of the first page. Returns the name; *base the
 * mapping. */
static char *guarded(const char *bytes, Py_ssize_t len, int terminated, char **base)
{
    Py_ssize_t total = len + (terminated ? 1 : 0);
    if (total <= 0 || total > pagesz) {
        PyErr_SetString(PyExc_ValueError, "guarded names are 1..page size bytes long");
        return NULL;
    }
    char *p = mmap(NULL, (size_t)(2 * pagesz), PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) {
        PyErr_SetFromErrno(PyExc_OSError);
        return NULL;
    }
    if (mprotect(p + pagesz, (size_t)pagesz, PROT_NONE) != 0) {
        munmap(p, (size_t)(2 * pagesz));
        PyErr_SetFromErrno(PyExc_OSError);
        return NULL;
    }
    /* the page is filled with a byte no name uses, never with 0 */
    memset(p, 0x7f, (size_t)pagesz);
    char *name = p + pagesz - total;
    memcpy(name, bytes, (size_t)len);
    if (terminated)
        name[len] = 0;
    atomic_fetch_add(&live_pages, 1);
    *base = p;
    return name;
}

static void unmap(char *base)
{
    munmap(base, (size_t)(2 * pagesz));
    atomic_fetch_sub(&live_pages, 1);
}

static void names_dtor(PyObject *cap)
{
    PyObject *t, *v, *tb;
    PyErr_Fetch(&t, &v, &tb);
    Ctx *c = PyCapsule_GetContext(cap);
    if (c) {
        const char *now = PyCapsule_GetName(cap);
        if (c->is_tensor) {
            DLManagedTensor *mt = c->pointer;
            if (c->made_as && now == c->made_as) {
                /* unconsumed "dltensor": the producer releases it */
                if (mt->deleter)
                    mt->deleter(mt);
            } else if (!c->made_as) {
                /* never a DLPack capsule: nobody could take it */
                tensor_deleter(mt);
            }
            /* else consumed: its consumer releases it */
        }
        for (int i = 0; i < c->npages; i++)
            unmap(c->pages[i]);
        free(c);
    }
    PyErr_Clear();
    PyErr_Restore(t, v, tb);
}

static PyObject *make(PyObject *self, PyObject *args, PyObject *kw)
{
    (void)self;
    static char *kwl[] = {"name", "terminated", "tensor", NULL};
    const char *bytes;
    Py_ssize_t len;
    int terminated = 0, tensor = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "y#|pp", kwl, &bytes, &len, &terminated, &tensor))
        return NULL;
    Ctx *c = calloc(1, sizeof *c);
    if (!c)
        return PyErr_NoMemory();
    char *base;
    char *name = guarded(bytes, len, terminated, &base);
    if (!name) {
        free(c);
        return NULL;
    }
    c->pages[c->npages++] = base;
    if (tensor) {
        c->pointer = new_tensor();
        if (!c->pointer) {
            unmap(base);
            free(c);
            return PyErr_NoMemory();
        }
        c->is_tensor = 1;
        if (terminated && len == 8 && memcmp(bytes, "dltensor", 8) == 0)
            c->made_as = name;
    } else {
        c->pointer = &dummy_struct;
    }
    PyObject *cap = PyCapsule_New(c->pointer, name, names_dtor);
    if (!cap || PyCapsule_SetContext(cap, c) != 0) {
        if (cap) {
            /* the destructor finds no context: free everything here */
            PyCapsule_SetDestructor(cap, NULL);
            Py_DECREF(cap);
        }
        if (c->is_tensor)
            tensor_deleter(c->pointer);
        unmap(base);
        free(c);
        return NULL;
    }
    return cap;
}

static PyObject *rename_cap(PyObject *self, PyObject *args, PyObject *kw)
{
    (void)self;
    static char *kwl[] = {"cap", "name", "terminated", NULL};
    PyObject *cap;
    const char *bytes;
    Py_ssize_t len;
    int terminated = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "Oy#|p", kwl, &cap, &bytes, &len, &terminated))
        return NULL;
    Ctx *c = PyCapsule_GetContext(cap);
    if (!c) {
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_ValueError, "not an st_names capsule");
        return NULL;
    }
    if (c->npages == MAXNAMES)
        return PyErr_Format(PyExc_ValueError, "at most %d names per capsule", MAXNAMES);
    char *base;
    char *name = guarded(bytes, len, terminated, &base);
    if (!name)
        return NULL;
    if (PyCapsule_SetName(cap, name) != 0) {
        unmap(base);
        return NULL;
    }
    c->pages[c->npages++] = base;
    Py_RETURN_NONE;
}

static PyObject *query(PyObject *self, PyObject *args)
{
    (void)self;
    PyObject *cap;
    const char *bytes;
    Py_ssize_t len;
    if (!PyArg_ParseTuple(args, "Oy#", &cap, &bytes, &len))
        return NULL;
    char *base;
    char *name = guarded(bytes, len, 0, &base);
    if (!name)
        return NULL;
    void *p = PyCapsule_GetPointer(cap, name);
    PyErr_Clear();
    int valid = PyCapsule_IsValid(cap, name);
    unmap(base);
    return Py_BuildValue("(OO)", p ? Py_True : Py_False, valid ? Py_True : Py_False);
}

static PyObject *live(PyObject *self, PyObject *noargs)
{
    (void)self;
    (void)noargs;
    return Py_BuildValue("(ll)", atomic_load(&live_pages), atomic_load(&live_tensors));
}

static PyMethodDef methods[] = {
    {"make", (PyCFunction)(void (*)(void))make, METH_VARARGS | METH_KEYWORDS,
     "make(name, terminated=False, tensor=False): a capsule named at a page end"},
    {"rename", (PyCFunction)(void (*)(void))rename_cap, METH_VARARGS | METH_KEYWORDS,
     "rename(cap, name, terminated=False): SetName to a name at a page end"},
    {"query", query, METH_VARARGS, "query(cap, name): GetPointer/IsValid with a guarded name"},
    {"live", live, METH_NOARGS, "(mapped name pages, live tensors)"},
    {NULL, NULL, 0, NULL}};

static struct PyModuleDef moddef = {PyModuleDef_HEAD_INIT, "st_names", NULL, -1, methods,
                                    NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit_st_names(void)
{
    pagesz = sysconf(_SC_PAGESIZE);
    return fx_module_nogil(PyModule_Create(&moddef));
}
