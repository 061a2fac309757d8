/* Prints the layout capsan must derive for the CPython whose headers this
 * is compiled against (-I its include dir, Py_BUILD_CORE internals): a row
 * as preload/core/pyversions.inc writes them, then the fields rows do not
 * have. tests/test_pyversions.py compiles it for every CPython the machine
 * has and compares it with what the runtime derives there (its table for
 * 3.10-3.12, the interpreter's _Py_DebugOffsets from 3.13 on). */
#define Py_BUILD_CORE 1
#include <Python.h>
#include <frameobject.h>
#include <internal/pycore_runtime.h>
#if PY_VERSION_HEX >= 0x030B0000
#include <internal/pycore_frame.h>
#endif
#if PY_VERSION_HEX >= 0x030E0000
#include <internal/pycore_stackref.h> /* Py_TAG_BITS */
#endif
#include <stddef.h>
#include <stdio.h>

#define OFF(t, f) ((int)offsetof(t, f))

int main(void)
{
#if PY_VERSION_HEX >= 0x030D0000
    /* 3.13: PyThreadState.current_frame, frames point at the instruction
     * executing now (instr_ptr), f_executable may be other than code */
    const char *model = "CS_PYF_INSTR_PTR";
    int ts_cframe = -1, cur = OFF(PyThreadState, current_frame);
    int f_code = OFF(_PyInterpreterFrame, f_executable), f_back = OFF(_PyInterpreterFrame, previous),
        f_instr = OFF(_PyInterpreterFrame, instr_ptr), f_owner = OFF(_PyInterpreterFrame, owner),
        f_entry = -1, gen = FRAME_OWNED_BY_GENERATOR;
#if PY_VERSION_HEX >= 0x030E0000
    /* 3.14 moved the shim onto FRAME_OWNED_BY_INTERPRETER (3), every owner
     * from it up is the interpreter's; 3.15 has no FRAME_OWNED_BY_CSTACK */
    int cstack = FRAME_OWNED_BY_INTERPRETER;
#else
    int cstack = FRAME_OWNED_BY_CSTACK;
#endif
#elif PY_VERSION_HEX >= 0x030B0000
    /* 3.11, 3.12: PyThreadState.cframe->current_frame, prev_instr */
    const char *model = "CS_PYF_PREV_INSTR";
    int ts_cframe = OFF(PyThreadState, cframe), cur = OFF(_PyCFrame, current_frame);
    int f_code = OFF(_PyInterpreterFrame, f_code), f_back = OFF(_PyInterpreterFrame, previous),
        f_instr = OFF(_PyInterpreterFrame, prev_instr), f_owner = OFF(_PyInterpreterFrame, owner),
        gen = FRAME_OWNED_BY_GENERATOR;
#if PY_VERSION_HEX >= 0x030C0000
    int f_entry = -1, cstack = FRAME_OWNED_BY_CSTACK;
#else
    int f_entry = OFF(_PyInterpreterFrame, is_entry), cstack = -1;
#endif
#else
    /* 3.10: PyThreadState.frame, a chain of PyFrameObjects, f_lasti an
     * instruction index */
    const char *model = "CS_PYF_OBJECT";
    int ts_cframe = -1, cur = OFF(PyThreadState, frame);
    int f_code = OFF(PyFrameObject, f_code), f_back = OFF(PyFrameObject, f_back),
        f_instr = OFF(PyFrameObject, f_lasti), f_owner = -1, f_entry = -1, cstack = -1, gen = -1;
#endif
#if PY_VERSION_HEX >= 0x030B0000
    int co_name = OFF(PyCodeObject, co_qualname), co_code = OFF(PyCodeObject, co_code_adaptive),
        co_first = OFF(PyCodeObject, _co_firsttraceable);
#else
    int co_name = OFF(PyCodeObject, co_name), co_code = -1, co_first = -1;
#endif
#if PY_VERSION_HEX >= 0x030B0000
    int ds_top = OFF(PyThreadState, datastack_top), ds_limit = OFF(PyThreadState, datastack_limit);
#else
    int ds_top = -1, ds_limit = -1; /* 3.10's frames are heap objects */
#endif
#if PY_VERSION_HEX < 0x030C0000
    int rt_ts = OFF(_PyRuntimeState, gilstate.tstate_current);
#else
    int rt_ts = -1; /* a C thread-local since 3.12 */
#endif
#if defined(Py_GIL_DISABLED) && PY_VERSION_HEX >= 0x030E0000
    int co_tlbc = OFF(PyCodeObject, co_tlbc), f_tlbc = OFF(_PyInterpreterFrame, tlbc_index);
#else
    int co_tlbc = -1, f_tlbc = -1;
#endif
#ifdef Py_GIL_DISABLED
    int ft = 1;
#else
    int ft = 0;
#endif
#ifdef Py_TAG_BITS
    unsigned tag = (unsigned)Py_TAG_BITS; /* f_executable is a _PyStackRef */
#else
    unsigned tag = 0;
#endif
    printf("PYV(%d, %s, %d, %d, %d, %d, %d, %d, %d, %d, %d, %d, %d, %d, %d, %d, %d, %d, %d, %d, %d, "
           "%d, %d) ob_type=%d exec_tag=%u co_tlbc=%d f_tlbc=%d free_threaded=%d\n",
           PY_MINOR_VERSION, model, ts_cframe, cur, f_code, f_back, f_instr, f_owner, f_entry,
           gen, cstack, OFF(PyCodeObject, co_filename), co_name,
           OFF(PyCodeObject, co_firstlineno), co_code, co_first, rt_ts,
           OFF(_PyRuntimeState, initialized), OFF(PyThreadState, thread_id),
           OFF(PyASCIIObject, state), (int)sizeof(PyASCIIObject), ds_top, ds_limit,
           OFF(PyObject, ob_type), tag, co_tlbc, f_tlbc, ft);
    return 0;
}
