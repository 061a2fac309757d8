/* dlsym the Python C-API (see pyapi.h). */
#include "pyapi.h"

#include <dlfcn.h>
#include <stdlib.h>
#include <string.h>

cs_pyapi cs_py;

#define SYM(field, name) (*(void **)&cs_py.field = dlsym(RTLD_DEFAULT, name))

int cs_pyapi_init(void)
{
    if (cs_py.ok)
        return 1;
    SYM(Capsule_New, "PyCapsule_New");
    SYM(Capsule_SetName, "PyCapsule_SetName");
    SYM(Capsule_GetPointer, "PyCapsule_GetPointer");
    SYM(Capsule_IsValid, "PyCapsule_IsValid");
    SYM(Capsule_SetDestructor, "PyCapsule_SetDestructor");
    SYM(Capsule_GetDestructor, "PyCapsule_GetDestructor");
    SYM(Capsule_SetPointer, "PyCapsule_SetPointer");
    SYM(Capsule_GetName, "PyCapsule_GetName");
    SYM(IsInitialized, "Py_IsInitialized");
    SYM(GILState_Check, "PyGILState_Check");
    SYM(ThreadState_UncheckedGet, "_PyThreadState_UncheckedGet");
    if (!cs_py.ThreadState_UncheckedGet) /* its public name since 3.13 */
        SYM(ThreadState_UncheckedGet, "PyThreadState_GetUnchecked");
    SYM(GILState_GetThisThreadState, "PyGILState_GetThisThreadState");
    SYM(Code_Addr2Line, "PyCode_Addr2Line");
    SYM(Unicode_AsUTF8, "PyUnicode_AsUTF8");
    SYM(Err_Fetch, "PyErr_Fetch");
    SYM(Err_Occurred, "PyErr_Occurred");
    SYM(Err_WriteUnraisable, "PyErr_WriteUnraisable");
    SYM(Err_Restore, "PyErr_Restore");
    SYM(IncRef, "Py_IncRef");
    SYM(DecRef, "Py_DecRef");
    SYM(TraceMalloc_Track, "PyTraceMalloc_Track");
    SYM(TraceMalloc_Untrack, "PyTraceMalloc_Untrack");
    SYM(ContextVar_New, "PyContextVar_New");
    SYM(ContextVar_Set, "PyContextVar_Set");
    SYM(Import_ImportModule, "PyImport_ImportModule");
    SYM(Object_GetAttrString, "PyObject_GetAttrString");
    SYM(Err_SetString, "PyErr_SetString");
    SYM(Exc_RuntimeError, "PyExc_RuntimeError");
    SYM(Type_IsSubtype, "PyType_IsSubtype");
    cs_py.Capsule_Type = dlsym(RTLD_DEFAULT, "PyCapsule_Type");
    SYM(Object_CallFunctionObjArgs, "PyObject_CallFunctionObjArgs");
    SYM(CFunction_NewEx, "PyCFunction_NewEx");
    SYM(AddPendingCall, "Py_AddPendingCall");
    SYM(Eval_GetFrame, "PyEval_GetFrame");
    SYM(Thread_get_thread_ident, "PyThread_get_thread_ident");
    SYM(Dict_Next, "PyDict_Next");
    SYM(Long_AsUnsignedLong, "PyLong_AsUnsignedLong");
    SYM(Sequence_List, "PySequence_List");
    SYM(List_New, "PyList_New");
    SYM(List_Append, "PyList_Append");
    SYM(Err_Clear, "PyErr_Clear");
    SYM(None_, "_Py_NoneStruct");
    SYM(True_, "_Py_TrueStruct");
    SYM(Import_GetModuleDict, "PyImport_GetModuleDict");
    SYM(Dict_GetItemString, "PyDict_GetItemString");
    SYM(Dict_SetItemString, "PyDict_SetItemString");
    cs_py.Module_Type = dlsym(RTLD_DEFAULT, "PyModule_Type");
    SYM(Module_GetDict, "PyModule_GetDict");
    SYM(List_Size, "PyList_Size");
    SYM(List_GetItem, "PyList_GetItem");
    cs_py.Code_Type = dlsym(RTLD_DEFAULT, "PyCode_Type");
    /* Py_Version since 3.11; Py_GetVersion()'s "3.10.13 (main, ..." always */
    const unsigned long *ver = dlsym(RTLD_DEFAULT, "Py_Version");
    const char *(*getver)(void) = (const char *(*)(void))dlsym(RTLD_DEFAULT, "Py_GetVersion");
    if (ver) {
        cs_py.major = (int)(*ver >> 24);
        cs_py.minor = (int)((*ver >> 16) & 0xff);
    } else if (getver) {
        char *end;
        const char *v = getver();
        cs_py.major = (int)strtol(v, &end, 10);
        cs_py.minor = *end == '.' ? (int)strtol(end + 1, NULL, 10) : 0;
    }
    /* the object head, the one thing every walk of objects needs */
    const void *none_type = dlsym(RTLD_DEFAULT, "_PyNone_Type");
    if (cs_py.None_ && none_type)
        for (size_t off = 8; off <= 24 && !cs_py.ob_type_off; off += 16)
            if (*(const void *const *)((const char *)cs_py.None_ + off) == none_type)
                cs_py.ob_type_off = off;
    cs_py.free_threaded = cs_py.ob_type_off == 24;
    cs_py.layout_why = "PyCode_Type or the current thread state's getter is missing";
    cs_py.layout = cs_py.ThreadState_UncheckedGet && cs_py.Code_Type
                       ? cs_pylayout_detect(cs_py.major, cs_py.minor, &cs_py.layout_why) : NULL;
    cs_py.ok = cs_py.Capsule_New && cs_py.Capsule_SetName && cs_py.Capsule_GetPointer &&
               cs_py.Capsule_IsValid && cs_py.Capsule_SetDestructor &&
               cs_py.Capsule_GetDestructor && cs_py.Capsule_SetPointer &&
               cs_py.Capsule_GetName && cs_py.IsInitialized && cs_py.GILState_Check &&
               cs_py.Code_Addr2Line && cs_py.Unicode_AsUTF8 && cs_py.Err_Fetch &&
               cs_py.Err_Restore && cs_py.IncRef && cs_py.DecRef && cs_py.Err_Occurred && cs_py.Err_WriteUnraisable;
    return cs_py.ok;
}

PyObject_ *cs_py_call_method0(PyObject_ *obj, const char *name)
{
    PyObject_ *f = cs_py.Object_GetAttrString(obj, name);
    PyObject_ *r = f ? cs_py.Object_CallFunctionObjArgs(f, NULL) : NULL;
    cs_py_xdecref(f);
    return r;
}

PyObject_ *cs_py_module(const char *name)
{
    PyObject_ *modules = cs_py.Import_GetModuleDict ? cs_py.Import_GetModuleDict() : NULL;
    return modules && cs_py.Dict_GetItemString ? cs_py.Dict_GetItemString(modules, name) : NULL;
}
