/* The memory library objects hold where tp_traverse cannot see (see
 * heldmem.h). */
#include "heldmem.h"

#include <string.h>

#define PA_PREFIX "pyarrow.lib."


static PyObject_ *module(const char *name)
{
    PyObject_ *modules = cs_py.Import_GetModuleDict ? cs_py.Import_GetModuleDict() : NULL;
    return modules && cs_py.Dict_GetItemString ? cs_py.Dict_GetItemString(modules, name) : NULL;
}

void cs_heldmem_init(cs_heldmem *h)
{
    h->pyarrow = module("pyarrow.lib") != NULL;
    h->torch_tensor = NULL;
    PyObject_ *c = module("torch._C");
    for (int i = 0; c && i < 2 && !h->torch_tensor; i++) {
        PyObject_ *t = cs_py.Object_GetAttrString(c, i ? "_TensorBase" : "TensorBase");
        if (!t)
            cs_py.Err_Clear();
        h->torch_tensor = t; /* torch._C keeps it */
        cs_py_xdecref(t);
    }
}

cs_held_lib cs_heldmem_lib(const cs_heldmem *h, const char *tp_name, int is_torch)
{
    if (is_torch)
        return CS_HELD_TORCH;
    if (h->pyarrow && tp_name && !strncmp(tp_name, PA_PREFIX, sizeof PA_PREFIX - 1))
        return CS_HELD_PYARROW;
    return CS_HELD_NONE;
}


static uint64_t as_address(PyObject_ *v)
{
    uint64_t a = v ? cs_py.Long_AsUnsignedLong(v) : 0;
    if (a == (uint64_t)-1) {
        cs_py.Err_Clear();
        a = 0;
    }
    return a;
}

typedef struct sink {
    void (*cb)(uint64_t, void *);
    void *ud;
} sink;

/* each buffer of a pyarrow Array (its children's too: Array.buffers()) */
static void array_buffers(const sink *s, PyObject_ *arr)
{
    PyObject_ *bufs = cs_py_call_method0(arr, "buffers");
    intptr_t nb = bufs ? cs_py.List_Size(bufs) : -1;
    for (intptr_t i = 0; i < nb; i++) {
        PyObject_ *b = cs_py.List_GetItem(bufs, i); /* borrowed; None for an absent one */
        PyObject_ *addr = b && b != cs_py.None_ ? cs_py.Object_GetAttrString(b, "address") : NULL;
        uint64_t a = as_address(addr);
        if (a)
            s->cb(a, s->ud);
        cs_py_xdecref(addr);
    }
    cs_py_xdecref(bufs);
    cs_py.Err_Clear();
}

static int has(PyObject_ *o, const char *attr)
{
    PyObject_ *a = cs_py.Object_GetAttrString(o, attr);
    if (!a)
        cs_py.Err_Clear();
    cs_py_xdecref(a);
    return a != NULL;
}

static void pa_buffers(const sink *s, PyObject_ *o, int depth);

/* each object of o.attr (a Table's columns, a ChunkedArray's chunks) */
static void each_of(const sink *s, PyObject_ *o, const char *attr, int depth)
{
    PyObject_ *l = cs_py.Object_GetAttrString(o, attr);
    PyObject_ *list = l ? cs_py.Sequence_List(l) : NULL;
    intptr_t k = list ? cs_py.List_Size(list) : -1;
    for (intptr_t i = 0; i < k; i++)
        pa_buffers(s, cs_py.List_GetItem(list, i), depth + 1);
    cs_py_xdecref(list), cs_py_xdecref(l);
    cs_py.Err_Clear();
}

/* An Array's buffers; a ChunkedArray's chunks'; a Table's or a
 * RecordBatch's columns' */
static void pa_buffers(const sink *s, PyObject_ *o, int depth)
{
    if (!o || depth > 3)
        return;
    if (has(o, "buffers"))
        array_buffers(s, o);
    else if (has(o, "chunks"))
        each_of(s, o, "chunks", depth);
    else if (has(o, "columns"))
        each_of(s, o, "columns", depth);
}

void cs_heldmem_addresses(PyObject_ *o, cs_held_lib lib, void (*cb)(uint64_t addr, void *ud),
                          void *ud)
{
    if (!cs_py.List_Size || !cs_py.List_GetItem || !cs_py.Long_AsUnsignedLong || !cs_py.None_ ||
        !cs_py.Sequence_List || !cs_py.Object_CallFunctionObjArgs)
        return;
    sink s = {cb, ud};
    if (lib == CS_HELD_PYARROW) {
        pa_buffers(&s, o, 0);
    } else if (lib == CS_HELD_TORCH) {
        PyObject_ *p = cs_py_call_method0(o, "data_ptr");
        uint64_t a = as_address(p);
        if (a)
            cb(a, ud);
        cs_py_xdecref(p);
        cs_py.Err_Clear();
    }
}
