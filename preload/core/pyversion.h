/* Which CPython this is, and the layout of its frames, code objects and
 * runtime state that capsan reads (pyversions.inc). */
#ifndef CAPSAN_PYVERSION_H
#define CAPSAN_PYVERSION_H

/* how a version chains its frames */
enum {
    CS_PYF_OBJECT = 1,     /* PyFrameObject, f_lasti an instruction index (3.10) */
    CS_PYF_PREV_INSTR = 2, /* _PyInterpreterFrame, prev_instr (3.11, 3.12) */
    CS_PYF_INSTR_PTR = 3,  /* _PyInterpreterFrame, instr_ptr (3.13) */
};

typedef struct cs_pylayout {
    int minor, model;
    int ts_cframe, cur;
    int f_code, f_back, f_instr, f_owner, f_entry;
    int owner_gen, owner_cstack;
    int co_filename, co_name, co_firstlineno, co_code, co_firsttraceable;
    int rt_tstate, rt_initialized, ts_thread_id;
    int str_state, str_data;
    int ts_ds_top, ts_ds_limit; /* PyThreadState.datastack_top, _limit (-1: none) */
} cs_pylayout;

/* The row for CPython 3.minor, or NULL. */
const cs_pylayout *cs_pylayout_for(int major, int minor);

#endif
