/* What a consumer written in Python made of a tensor's pointer (R17; see
 * consumer_view.h). warp's from_dlpack reads the DLTensor through ctypes,
 * builds its array from data alone, then renames the capsule through
 * ctypes too: at that rename the consumer's own frame is the innermost
 * Python frame, and the array it made is one of its locals. Where that
 * array says it starts (__array_interface__, __cuda_array_interface__) is
 * the answer. A native consumer (numpy, a Cython module) is still building
 * its array at the rename, and the innermost frame is its caller's: none
 * of that frame's objects is asked anything. */
#include "consumer_view.h"

#include <dlfcn.h>
#include <string.h>

#include "pyapi.h"

/* The rename was made by Python code through a foreign-function call
 * (ctypes, cffi): the code at ret is libffi's or its callers' */
static int called_from_python(const void *ret)
{
    Dl_info di;
    if (!ret || !dladdr(ret, &di) || !di.dli_fname)
        return 0;
    const char *slash = strrchr(di.dli_fname, '/');
    const char *f = slash ? slash + 1 : di.dli_fname;
    return !strncmp(f, "libffi", 6) || !strncmp(f, "_ctypes", 7) ||
           !strncmp(f, "_cffi_backend", 13);
}

/* interface["data"][0] of o's __array_interface__ or
 * __cuda_array_interface__, 0 if it has neither */
static uint64_t interface_start(PyObject_ *o)
{
    static const char *const names[] = {"__array_interface__", "__cuda_array_interface__"};
    for (int i = 0; i < 2; i++) {
        PyObject_ *d = cs_py.Object_GetAttrString(o, names[i]);
        if (!d) {
            cs_py.Err_Clear();
            continue;
        }
        /* borrowed; NULL for what is not a dict */
        PyObject_ *data = cs_py.Dict_GetItemString(d, "data");
        PyObject_ *l = data ? cs_py.Sequence_List(data) : NULL;
        PyObject_ *p = l && cs_py.List_Size(l) > 0 ? cs_py.List_GetItem(l, 0) : NULL;
        uint64_t a = p ? cs_py.Long_AsUnsignedLong(p) : 0;
        cs_py_xdecref(l);
        cs_py.DecRef(d);
        cs_py.Err_Clear();
        if (a != (uint64_t)-1 && a)
            return a;
    }
    return 0;
}

int cs_consumer_view(const void *ret, uint64_t data, uint64_t off)
{
    if (!cs_py.Eval_GetFrame || !cs_py.ob_type_off || !called_from_python(ret) ||
        !cs_py_has_gil())
        return CS_VIEW_UNKNOWN;
    PyObject_ *f = cs_py.Eval_GetFrame(); /* borrowed */
    if (!f)
        return CS_VIEW_UNKNOWN;
    /* whatever the program had raised stays raised: nothing asked here
     * may leave or clear an exception */
    PyObject_ *et, *ev, *tb;
    cs_py.Err_Fetch(&et, &ev, &tb);
    int verdict = CS_VIEW_UNKNOWN;
    PyObject_ *loc = cs_py.Object_GetAttrString(f, "f_locals");
    PyObject_ *vals = loc ? cs_py_call_method0(loc, "values") : NULL;
    PyObject_ *list = vals ? cs_py.Sequence_List(vals) : NULL;
    intptr_t n = list ? cs_py.List_Size(list) : 0;
    for (intptr_t i = 0; i < n && verdict != CS_VIEW_HONORED; i++) {
        PyObject_ *o = cs_py.List_GetItem(list, i);
        if (!o || o == cs_py.None_ || cs_py.Type_IsSubtype(*(void **)((char *)o + cs_py.ob_type_off),
                                                            cs_py.Module_Type))
            continue;
        uint64_t start = interface_start(o);
        /* one array of the tensor's that starts at its first element
         * settles it: the consumer honors byte_offset */
        if (start == data + off)
            verdict = CS_VIEW_HONORED;
        else if (start == data)
            verdict = CS_VIEW_IGNORED;
    }
    cs_py_xdecref(list), cs_py_xdecref(vals), cs_py_xdecref(loc);
    cs_py.Err_Clear();
    cs_py.Err_Restore(et, ev, tb);
    return verdict;
}
