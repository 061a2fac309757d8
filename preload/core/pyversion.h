/* Which CPython this is, and the layout of its frames, code objects and
 * runtime state that capsan reads. The one place that asks: 3.10-3.12
 * from capsan's table (pyversions.inc), 3.13 and later from the block the
 * interpreter publishes about itself (_Py_DebugOffsets, pydebugoffsets.c),
 * with the semantics that block does not carry written once per version. */
#ifndef CAPSAN_PYVERSION_H
#define CAPSAN_PYVERSION_H

#include <stddef.h>

/* how a version chains its frames */
enum {
    CS_PYF_OBJECT = 1,     /* PyFrameObject, f_lasti an instruction index (3.10) */
    CS_PYF_PREV_INSTR = 2, /* _PyInterpreterFrame, prev_instr (3.11, 3.12) */
    CS_PYF_INSTR_PTR = 3,  /* _PyInterpreterFrame, instr_ptr (3.13+) */
};

typedef struct cs_pylayout {
    int minor, model;
    int ts_cframe, cur;
    int f_code, f_back, f_instr, f_owner, f_entry;
    /* owner_gen: a generator's frame; owner_shim: this owner value and
     * the ones above it are the interpreter's own frames, no Python code
     * (3.12/3.13's FRAME_OWNED_BY_CSTACK, 3.14+'s FRAME_OWNED_BY_INTERPRETER
     * and what follows it; -1: none) */
    int owner_gen, owner_shim;
    int co_filename, co_name, co_firstlineno, co_code, co_firsttraceable;
    int rt_tstate, rt_initialized, ts_thread_id;
    int str_state, str_data;
    int ts_ds_top, ts_ds_limit; /* PyThreadState.datastack_top, _limit (-1: none) */
    /* ---- not in the table's rows: 3.13+ or free-threaded builds ---- */
    int ob_type;          /* PyObject.ob_type: 8, or 24 on free-threaded builds */
    unsigned exec_tag;    /* tag bits of f_executable (a _PyStackRef since 3.14) */
    int co_tlbc, f_tlbc;  /* free-threaded 3.14+: the code's per-thread bytecode
                           * copies and the frame's index into them (-1: none) */
    int free_threaded;
    const char *source;   /* where the offsets came from, for notes */
} cs_pylayout;

/* The layout of the interpreter this process runs (CPython 3.minor), or
 * NULL with *why saying what is missing: capsan's stacks are then native
 * only and every check that needs Python frames gives no finding. */
const cs_pylayout *cs_pylayout_detect(int major, int minor, const char **why);

/* The table's row for 3.minor (3.10-3.12), or NULL. */
const cs_pylayout *cs_pylayout_row(int minor);

/* The layout _Py_DebugOffsets at `runtime` (the start of _PyRuntime)
 * describes for 3.minor, written into *out; NULL with *why when the block
 * is not one capsan can prove (pydebugoffsets.c). */
const cs_pylayout *cs_pylayout_from_debug(const void *runtime, int minor, cs_pylayout *out,
                                          const char **why);

/* The layout as a row of pyversions.inc (tests compare it with the
 * interpreter's own headers), plus the fields rows do not have. */
int cs_pylayout_format(const cs_pylayout *l, char *buf, size_t n);

/* A frame's code object: f_executable with its tag bits cleared. */
static inline const char *cs_frame_code(const cs_pylayout *l, const char *f)
{
    return (const char *)(*(const unsigned long *)(f + l->f_code) & ~(unsigned long)l->exec_tag);
}

#endif
