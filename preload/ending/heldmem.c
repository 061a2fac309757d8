/* The memory library objects hold where tp_traverse cannot see (see
 * heldmem.h). */
#include "heldmem.h"

#include <dlfcn.h>
#include <string.h>

#include "lifecycle.h"

#define PA_PREFIX "pyarrow.lib."



static uintptr_t base_of(uintptr_t addr)
{
    Dl_info di;
    return addr && dladdr((void *)addr, &di) ? (uintptr_t)di.dli_fbase : 0;
}

/* module's attribute (a type the module keeps), or NULL */
static const void *type_in(const char *mod, const char *const *names, int n)
{
    PyObject_ *m = cs_py_module(mod);
    for (int i = 0; m && i < n; i++) {
        PyObject_ *t = cs_py.Object_GetAttrString(m, names[i]);
        if (!t) {
            cs_py.Err_Clear();
            continue;
        }
        cs_py_xdecref(t);
        return t;
    }
    return NULL;
}

void cs_heldmem_init(cs_heldmem *h)
{
    static const char *const torch[] = {"TensorBase", "_TensorBase"}, *const ffi[] = {"CObject"};
    h->pyarrow = cs_py_module("pyarrow.lib") != NULL;
    h->torch_tensor = type_in("torch._C", torch, 2);
    h->ffi_object = type_in("tvm_ffi.core", ffi, 1);
    h->torch_base = base_of((uintptr_t)h->torch_tensor);
    h->ffi_base = base_of((uintptr_t)h->ffi_object);
}

int cs_heldmem_consumed_by(const cs_heldmem *h, cs_held_lib lib, uint64_t consumer)
{
    if (lib == CS_HELD_TVM_FFI)
        return consumer == CS_LC_WHO_XFROM || (h->ffi_base && base_of(consumer) == h->ffi_base);
    if (lib == CS_HELD_TORCH)
        return consumer > CS_LC_WHO_XFROM && h->torch_base && base_of(consumer) == h->torch_base;
    return 0; /* pyarrow's buffers are a producer's */
}

static int subtype(const void *tp, const void *base)
{
    return base && (tp == base || cs_py.Type_IsSubtype(tp, base));
}

cs_held_lib cs_heldmem_lib(const cs_heldmem *h, const void *tp, const char *tp_name)
{
    if (subtype(tp, h->torch_tensor))
        return CS_HELD_TORCH;
    if (subtype(tp, h->ffi_object))
        return CS_HELD_TVM_FFI;
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

/* A pyarrow object the walk met: one made with __new__ and no __init__
 * crashes its getters (a NULL C++ object), so only what says it is whole
 * is asked: an Array whose type is set, a Table or a RecordBatch that is
 * _is_initialized(). A ChunkedArray has no such check: only those a
 * Table's columns give are asked. */
static void pa_object(const sink *s, PyObject_ *o)
{
    PyObject_ *v = NULL;
    int whole = 0;
    if (has(o, "buffers")) {
        v = cs_py.Object_GetAttrString(o, "type");
        whole = v && v != cs_py.None_;
    } else if (has(o, "_is_initialized")) {
        v = cs_py_call_method0(o, "_is_initialized");
        whole = v && v != cs_py.None_ && v == cs_py.True_;
    }
    cs_py_xdecref(v);
    cs_py.Err_Clear();
    if (whole)
        pa_buffers(s, o, 0);
}

static void data_ptr(const sink *s, PyObject_ *o)
{
    PyObject_ *p = cs_py_call_method0(o, "data_ptr");
    uint64_t a = as_address(p);
    if (a)
        s->cb(a, s->ud);
    cs_py_xdecref(p);
    cs_py.Err_Clear();
}

/* a tvm-ffi tensor's data, or the tensors' of a container (an Array or a
 * List is a sequence; a Map's values) */
static void ffi_data(const sink *s, PyObject_ *o, int depth)
{
    if (!o || depth > 3)
        return;
    if (has(o, "data_ptr")) {
        data_ptr(s, o);
        return;
    }
    PyObject_ *vals = has(o, "values") ? cs_py_call_method0(o, "values") : NULL;
    PyObject_ *list = cs_py.Sequence_List(vals ? vals : o);
    intptr_t k = list ? cs_py.List_Size(list) : -1;
    for (intptr_t i = 0; i < k; i++)
        ffi_data(s, cs_py.List_GetItem(list, i), depth + 1);
    cs_py_xdecref(list), cs_py_xdecref(vals);
    cs_py.Err_Clear();
}

void cs_heldmem_addresses(PyObject_ *o, cs_held_lib lib, void (*cb)(uint64_t addr, void *ud),
                          void *ud)
{
    if (!cs_py.List_Size || !cs_py.List_GetItem || !cs_py.Long_AsUnsignedLong || !cs_py.None_ ||
        !cs_py.Sequence_List || !cs_py.Object_CallFunctionObjArgs)
        return;
    sink s = {cb, ud};
    if (lib == CS_HELD_PYARROW)
        pa_object(&s, o);
    else if (lib == CS_HELD_TORCH)
        data_ptr(&s, o);
    else if (lib == CS_HELD_TVM_FFI)
        ffi_data(&s, o, 0);
}
