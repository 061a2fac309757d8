/* The layout CPython 3.13+ publishes about itself: _Py_DebugOffsets, the
 * first member of _PyRuntime (cookie "xdebugpy", the hex version, whether
 * the build is free-threaded, then the offsets of the thread state, the
 * interpreter frame, code objects, objects, types and strings, each group
 * led by its struct's size). pystack, memray and CPython's own remote
 * debugging read it; capsan reads it in-process, so that a patch release
 * that moves a field, or a free-threaded build, needs no new row.
 *
 * The block is stable within a minor version only: pydebugoffsets.inc
 * says, per minor, which word of it holds what. What it does not carry
 * (which owner values are shims, the tag of f_executable, where
 * _co_firsttraceable and the data stack's top lie beside the fields it
 * names) is written below, per version, once. A block that fails any
 * check gives no layout: native-only stacks, never a guess. */
#include "pyversion.h"

#include <dlfcn.h>
#include <stdint.h>
#include <string.h>

#include "probe.h"

typedef struct dbo_row {
    int minor, nwords;
    int ts_size, ts_current_frame, ts_thread_id, ts_datastack_chunk;
    int fr_size, fr_previous, fr_executable, fr_instr_ptr, fr_owner, fr_tlbc_index;
    int co_size, co_filename, co_qualname, co_firstlineno, co_code_adaptive, co_tlbc;
    int ob_size, ob_type;
    int str_size, str_state, str_asciisize;
} dbo_row;

static const dbo_row rows[] = {
#define DBO(...) {__VA_ARGS__},
#include "pydebugoffsets.inc"
#undef DBO
};

#define NROWS (sizeof rows / sizeof rows[0])

static const dbo_row *row_for(int minor)
{
    for (size_t i = 0; i < NROWS; i++)
        if (rows[i].minor == minor)
            return &rows[i];
    return NULL;
}

/* an offset the block gives for a struct of `size` bytes */
static int field(const uint64_t *w, int idx, int size_idx, int width, int *out)
{
    if (idx < 0) {
        *out = -1;
        return 1;
    }
    uint64_t size = w[size_idx], off = w[idx];
    if (size == 0 || size > (1u << 16) || off + (uint64_t)width > size)
        return 0;
    *out = (int)off;
    return 1;
}

const cs_pylayout *cs_pylayout_from_debug(const void *runtime, int minor, cs_pylayout *out,
                                          const char **why)
{
    const dbo_row *r = row_for(minor);
    if (!r) {
        *why = "its _Py_DebugOffsets block is of a version newer than capsan knows";
        return NULL;
    }
    if (!cs_probe_read(runtime, (size_t)r->nwords * 8)) {
        *why = "_PyRuntime is not readable";
        return NULL;
    }
    const uint64_t *w = runtime;
    if (memcmp(w, "xdebugpy", 8) != 0) {
        *why = "_PyRuntime does not start with the _Py_DebugOffsets cookie";
        return NULL;
    }
    uint64_t hex = w[1];
    if ((hex >> 24) != 3 || ((hex >> 16) & 0xff) != (uint64_t)minor) {
        *why = "_Py_DebugOffsets names another version than the interpreter";
        return NULL;
    }
    if (w[2] > 1) {
        *why = "_Py_DebugOffsets' free_threaded flag is neither 0 nor 1";
        return NULL;
    }
    cs_pylayout l = {0};
    l.minor = minor;
    l.model = CS_PYF_INSTR_PTR;
    l.free_threaded = (int)w[2];
    l.source = "the interpreter's _Py_DebugOffsets";
    int ok = field(w, r->ts_current_frame, r->ts_size, 8, &l.cur) &&
             field(w, r->ts_thread_id, r->ts_size, 8, &l.ts_thread_id) &&
             field(w, r->fr_previous, r->fr_size, 8, &l.f_back) &&
             field(w, r->fr_executable, r->fr_size, 8, &l.f_code) &&
             field(w, r->fr_instr_ptr, r->fr_size, 8, &l.f_instr) &&
             field(w, r->fr_owner, r->fr_size, 1, &l.f_owner) &&
             /* a default build names no per-thread bytecode (0 there) */
             field(w, l.free_threaded ? r->fr_tlbc_index : -1, r->fr_size, 4, &l.f_tlbc) &&
             field(w, r->co_filename, r->co_size, 8, &l.co_filename) &&
             field(w, r->co_qualname, r->co_size, 8, &l.co_name) &&
             field(w, r->co_firstlineno, r->co_size, 4, &l.co_firstlineno) &&
             field(w, r->co_code_adaptive, r->co_size, 0, &l.co_code) &&
             field(w, l.free_threaded ? r->co_tlbc : -1, r->co_size, 8, &l.co_tlbc) &&
             field(w, r->ob_type, r->ob_size, 8, &l.ob_type) &&
             field(w, r->str_state, r->str_size, 4, &l.str_state) &&
             field(w, r->str_asciisize, r->str_size, 0, &l.str_data);
    int chunk = -1;
    ok = ok && field(w, r->ts_datastack_chunk, r->ts_size, 24, &chunk);
    if (!ok || l.cur < 0 || l.f_owner < 0 || l.co_code < 24) {
        *why = "_Py_DebugOffsets holds an offset outside its own struct sizes";
        return NULL;
    }
    /* What the block does not say, per version:
     * - no C frame struct since 3.13: the thread state holds the frame;
     *   no is_entry field: entries are the frames above a shim, owner 3
     *   (FRAME_OWNED_BY_CSTACK in 3.13, FRAME_OWNED_BY_INTERPRETER from
     *   3.14 on, where 4 and up are the interpreter's too); a generator's
     *   frame is owner 1 throughout;
     * - _co_firsttraceable is followed by co_extra, then (free-threaded
     *   3.14+) co_tlbc, then co_code_adaptive;
     * - datastack_top and datastack_limit follow datastack_chunk;
     * - the current thread state is a C thread-local (3.12+): no
     *   _PyRuntime shortcut for the GIL check; `initialized` is the
     *   fifth int after the block;
     * - f_executable is a _PyStackRef since 3.14: its low bits tag it. */
    l.ts_cframe = -1;
    l.f_entry = -1;
    l.owner_gen = 1;
    l.owner_shim = 3;
    l.co_firsttraceable = l.co_code - 16 - (l.co_tlbc >= 0 ? 8 : 0);
    l.ts_ds_top = chunk + 8;
    l.ts_ds_limit = chunk + 16;
    l.rt_tstate = -1;
    l.rt_initialized = r->nwords * 8 + 16;
    l.exec_tag = minor >= 14 ? 7u : 0u;
    if ((l.co_tlbc >= 0) != (l.f_tlbc >= 0) || (l.co_tlbc >= 0 && l.co_tlbc != l.co_code - 8)) {
        *why = "co_tlbc does not lie where capsan expects it";
        return NULL;
    }
    /* the object header's size is the build's: a type's fields beside
     * it shift with it (pyreach.c reads types past the head) */
    if (l.ob_type != (l.free_threaded ? 24 : 8)) {
        *why = "PyObject's ob_type is neither where a default nor a free-threaded build has it";
        return NULL;
    }
    *out = l;
    return out;
}
