/* Which layout the running interpreter has (pyversion.h): capsan's table
 * for 3.10-3.12, the interpreter's own _Py_DebugOffsets from 3.13 on. */
#include "pyversion.h"

#include <dlfcn.h>
#include <stdio.h>

static const cs_pylayout layouts[] = {
#define PYV(minor, model, ...)                                                                     \
    {minor, model, __VA_ARGS__, .ob_type = 8, .exec_tag = 0, .co_tlbc = -1, .f_tlbc = -1,         \
     .free_threaded = 0, .source = "capsan's table (pyversions.inc)"},
#include "pyversions.inc"
#undef PYV
};

const cs_pylayout *cs_pylayout_row(int minor)
{
    for (size_t i = 0; i < sizeof layouts / sizeof layouts[0]; i++)
        if (layouts[i].minor == minor)
            return &layouts[i];
    return NULL;
}

const cs_pylayout *cs_pylayout_detect(int major, int minor, const char **why)
{
    static cs_pylayout from_block;
    *why = NULL;
    if (major != 3 || minor < 10) {
        *why = "not a CPython capsan reads (3.10 and later)";
        return NULL;
    }
    if (minor <= 12) {
        const cs_pylayout *l = cs_pylayout_row(minor);
        if (!l)
            *why = "no row in pyversions.inc";
        return l;
    }
    /* the block is the first member of _PyRuntime, exported by every
     * libpython and by an executable that links it in with its symbols */
    const void *rt = dlsym(RTLD_DEFAULT, "_PyRuntime");
    if (!rt) {
        *why = "_PyRuntime is not exported, so its _Py_DebugOffsets cannot be read";
        return NULL;
    }
    const cs_pylayout *l = cs_pylayout_from_debug(rt, minor, &from_block, why);
    /* the block is the interpreter's word; None's type where it says
     * ob_type lies is a live proof of the object head it implies */
    const char *none = dlsym(RTLD_DEFAULT, "_Py_NoneStruct");
    const void *none_type = dlsym(RTLD_DEFAULT, "_PyNone_Type");
    if (l && none && none_type && *(const void *const *)(none + l->ob_type) != none_type) {
        *why = "None's type is not where _Py_DebugOffsets puts ob_type";
        return NULL;
    }
    return l;
}

int cs_pylayout_format(const cs_pylayout *l, char *buf, size_t n)
{
    static const char *const models[] = {"?", "CS_PYF_OBJECT", "CS_PYF_PREV_INSTR",
                                         "CS_PYF_INSTR_PTR"};
    const char *model = l->model >= 1 && l->model <= 3 ? models[l->model] : models[0];
    return snprintf(buf, n,
                    "PYV(%d, %s, %d, %d, %d, %d, %d, %d, %d, %d, %d, %d, %d, %d, %d, %d, %d, %d, "
                    "%d, %d, %d, %d, %d) ob_type=%d exec_tag=%u co_tlbc=%d f_tlbc=%d "
                    "free_threaded=%d",
                    l->minor, model, l->ts_cframe, l->cur, l->f_code, l->f_back, l->f_instr,
                    l->f_owner, l->f_entry, l->owner_gen, l->owner_shim, l->co_filename,
                    l->co_name, l->co_firstlineno, l->co_code, l->co_firsttraceable, l->rt_tstate,
                    l->rt_initialized, l->ts_thread_id, l->str_state, l->str_data, l->ts_ds_top,
                    l->ts_ds_limit, l->ob_type, l->exec_tag, l->co_tlbc, l->f_tlbc,
                    l->free_threaded);
}
