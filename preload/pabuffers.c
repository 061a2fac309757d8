/* The NumPy blocks pyarrow objects wrap without a copy (see pabuffers.h). */
#include "pabuffers.h"

#include <string.h>

#define PREFIX "pyarrow.lib."

int cs_pa_imported(void)
{
    PyObject_ *modules = cs_py.Import_GetModuleDict ? cs_py.Import_GetModuleDict() : NULL;
    return modules && cs_py.Dict_GetItemString && cs_py.Dict_GetItemString(modules, "pyarrow.lib");
}

int cs_pa_type(const char *tp_name)
{
    return tp_name && !strncmp(tp_name, PREFIX, sizeof PREFIX - 1);
}

typedef struct scan {
    const uint64_t *want, *sizes;
    size_t n, set;
    uint8_t *found, how;
    uint64_t *where;
} scan;

static void xdecref(PyObject_ *o)
{
    if (o)
        cs_py.DecRef(o);
}

/* the block among the sorted keys whose bytes hold addr, or -1 */
static long block_of(const scan *s, uint64_t addr)
{
    size_t lo = 0, hi = s->n;
    while (lo < hi) { /* the first key above addr */
        size_t mid = lo + (hi - lo) / 2;
        if (s->want[mid] <= addr)
            lo = mid + 1;
        else
            hi = mid;
    }
    if (!lo || addr - s->want[lo - 1] >= (s->sizes[lo - 1] ? s->sizes[lo - 1] : 1))
        return -1;
    return (long)(lo - 1);
}

static PyObject_ *call_attr(PyObject_ *obj, const char *name)
{
    PyObject_ *f = cs_py.Object_GetAttrString(obj, name);
    PyObject_ *r = f ? cs_py.Object_CallFunctionObjArgs(f, NULL) : NULL;
    xdecref(f);
    return r;
}

/* each buffer of a pyarrow Array (its children's too: Array.buffers()) */
static void array_buffers(scan *s, PyObject_ *arr)
{
    PyObject_ *bufs = call_attr(arr, "buffers");
    intptr_t nb = bufs ? cs_py.List_Size(bufs) : -1;
    for (intptr_t i = 0; i < nb; i++) {
        PyObject_ *b = cs_py.List_GetItem(bufs, i); /* borrowed; None for an absent one */
        PyObject_ *addr = b && b != cs_py.None_ ? cs_py.Object_GetAttrString(b, "address") : NULL;
        uint64_t a = addr ? cs_py.Long_AsUnsignedLong(addr) : 0;
        long k = a && a != (uint64_t)-1 ? block_of(s, a) : -1;
        if (k >= 0 && s->found[k] != s->how) {
            s->found[k] = s->how;
            if (s->where)
                s->where[k] = a;
            s->set++;
        }
        xdecref(addr);
    }
    xdecref(bufs);
    cs_py.Err_Clear();
}

static int has(PyObject_ *o, const char *attr)
{
    PyObject_ *a = cs_py.Object_GetAttrString(o, attr);
    if (!a)
        cs_py.Err_Clear();
    xdecref(a);
    return a != NULL;
}

static void buffers_of(scan *s, PyObject_ *o, int depth);

/* each object of o.attr (a Table's columns, a ChunkedArray's chunks) */
static void each_of(scan *s, PyObject_ *o, const char *attr, int depth)
{
    PyObject_ *l = cs_py.Object_GetAttrString(o, attr);
    PyObject_ *list = l ? cs_py.Sequence_List(l) : NULL;
    intptr_t k = list ? cs_py.List_Size(list) : -1;
    for (intptr_t i = 0; i < k; i++)
        buffers_of(s, cs_py.List_GetItem(list, i), depth + 1);
    xdecref(list), xdecref(l);
    cs_py.Err_Clear();
}

/* An Array's buffers; a ChunkedArray's chunks'; a Table's or a
 * RecordBatch's columns' */
static void buffers_of(scan *s, PyObject_ *o, int depth)
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

size_t cs_pa_buffers(PyObject_ *const *objs, size_t nobjs, const uint64_t *want,
                     const uint64_t *sizes, size_t n, uint8_t *found, uint8_t how,
                     uint64_t *where)
{
    if (!cs_py.List_Size || !cs_py.List_GetItem || !cs_py.Long_AsUnsignedLong || !cs_py.None_ ||
        !cs_py.Sequence_List || !cs_py.Object_CallFunctionObjArgs)
        return 0;
    scan s = {want, sizes, n, 0, found, how, where};
    for (size_t i = 0; i < nobjs && s.set < n; i++)
        buffers_of(&s, objs[i], 0);
    return s.set;
}
