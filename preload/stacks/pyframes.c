/* The interpreter's frames (stack_int.h), read at the layout offsets of
 * the running version: which frame runs code, its instruction and line,
 * whether it began a C-level evaluation; the thread's Python position
 * (stack.h's cs_stack_py_pos); a capture's Python frames, with each
 * (code, instruction)'s line kept in the thread's cache. */
#include "stack_int.h"

#include "probe.h"

/* The next frame of the chain that runs code, and whether `f` is the
 * outermost frame of its C-level evaluation (the native stack holds one
 * _PyEval_EvalFrameDefault per such group). */
const char *code_frame(const cs_pylayout *l, const char *f)
{
    for (; f; f = AT(f, l->f_back, const char *)) {
        if (l->model == CS_PYF_OBJECT)
            return f;
        char owner = AT(f, l->f_owner, char);
        if (l->owner_shim >= 0 && owner >= l->owner_shim)
            continue; /* the shim an evaluation starts with (3.12+) */
        const char *co = frame_code(l, f);
        if (!co || obj_type(l, co) != cs_py.Code_Type)
            continue; /* 3.13's f_executable may be other than code */
        /* incomplete: set up, its first instruction not yet run */
        const char *first = frame_bytecode(l, f, co) + 2 * AT(co, l->co_firsttraceable, int);
        if (owner != l->owner_gen && AT(f, l->f_instr, const char *) < first)
            continue;
        return f;
    }
    return NULL;
}

int is_entry(const cs_pylayout *l, const char *f)
{
    if (l->f_entry >= 0)
        return AT(f, l->f_entry, char) != 0;
    if (l->owner_shim < 0)
        return 1; /* 3.10: one evaluation a frame */
    const char *prev = AT(f, l->f_back, const char *);
    return !prev || AT(prev, l->f_owner, char) >= l->owner_shim;
}

/* The instruction a frame is at, in code units from the code's start
 * (what PyCode_Addr2Line wants, times two). */
static int frame_lasti(const cs_pylayout *l, const char *f, const char *co)
{
    if (l->model == CS_PYF_OBJECT)
        return AT(f, l->f_instr, int);
    return (int)((AT(f, l->f_instr, const char *) - frame_bytecode(l, f, co)) / 2);
}

static const char *top_frame(const cs_pylayout *l, int gil)
{
    return code_frame(l, raw_top(l, gil));
}

int cs_stack_py_pos(int gil, cs_py_pos *pos)
{
    const cs_pylayout *l = cs_py.layout;
    const char *f = cs_py.ok && l && (gil || cs_py_live()) ? top_frame(l, gil) : NULL;
    pos->frame = (uint64_t)(uintptr_t)f;
    pos->instr = f ? frame_instr(l, f) : 0;
    return f != NULL;
}

int cs_stack_py_within(int gil, const cs_py_pos *pos)
{
    const cs_pylayout *l = cs_py.layout;
    if (!pos->frame || !cs_py.ok || !l || !(gil || cs_py_live()))
        return 0;
    const char *f = top_frame(l, gil);
    for (int k = 0; f && k < 4096; k++, f = code_frame(l, AT(f, l->f_back, const char *)))
        if ((uint64_t)(uintptr_t)f == pos->frame)
            return frame_instr(l, f) == pos->instr;
    return 0;
}

/* gil == 0: nothing may be interned. *rest: the first frame not recorded. */
int python_frames(cs_stack_cache *c, const char *f, uint64_t *out, int max, int gil,
                  int *importing, const char **rest, raw_frames *raw)
{
    const cs_pylayout *l = cs_py.layout;
    int n = 0;
    for (; f && n < max; f = code_frame(l, AT(f, l->f_back, const char *))) {
        code_obj *co = (code_obj *)(uintptr_t)frame_code(l, f);
        int lasti = frame_lasti(l, f, (const char *)co);
        unsigned slot = (unsigned)(((uintptr_t)co >> 4) ^ (unsigned)lasti * 2654435761u) % LSETS;
        int line;
        uint32_t id;
        lentry *w = c->lines[slot];
        if (w[0].code == co && w[0].lasti == lasti) {
            line = w[0].line;
            id = w[0].code_id;
        } else if (w[1].code == co && w[1].lasti == lasti) {
            line = w[1].line;
            id = w[1].code_id;
        } else {
            id = code_id(co, gil);
            if (!id)
                break;
            line = cs_py.Code_Addr2Line(co, lasti * 2);
            if (!code_at(id)->weak) { /* a weak entry is checked at each use */
                w[c->lvictim[slot]] = (lentry){.code = co, .lasti = lasti, .line = line, .code_id = id};
                c->lvictim[slot] ^= 1;
            }
        }
        if (code_at(id)->importlib)
            *importing = 1;
        int entry = is_entry(l, f);
        if (raw && n < MEMO_PY) {
            raw->strong &= !code_at(id)->weak;
            raw->co[n] = co;
            raw->ip[n] = raw_ip(frame_instr(l, f), entry);
        }
        out[n++] = CS_FRAME_PY_VALUE(id, line < 0 ? 0 : line, entry);
    }
    *rest = f;
    return n;
}


const void *cs_stack_py_tstate(int gil)
{
    if (!cs_py.ok)
        return NULL;
    return gil ? cs_py.ThreadState_UncheckedGet()
               : cs_py.GILState_GetThisThreadState ? cs_py.GILState_GetThisThreadState() : NULL;
}

/* a pointer field of foreign memory that may be gone: NULL if unreadable */
static const char *probed_ptr(const char *p, int off)
{
    if (!p || off < 0 || !cs_probe_read(p + off, sizeof(void *)))
        return NULL;
    return AT(p, off, const char *);
}

int cs_stack_py_within_ts(const void *ts, const cs_py_pos *pos)
{
    const cs_pylayout *l = cs_py.layout;
    if (!ts || !pos->frame || !cs_py.ok || !l)
        return 0;
    const char *f = ts;
    if (l->ts_cframe >= 0 && !(f = probed_ptr(f, l->ts_cframe)))
        return 0;
    /* the frame itself is enough: pos names one that ran code */
    f = probed_ptr(f, l->cur);
    for (int k = 0; f && k < 4096; k++, f = probed_ptr(f, l->f_back))
        if ((uint64_t)(uintptr_t)f == pos->frame) {
            int off = l->f_instr;
            if (!cs_probe_read(f + off, sizeof(uint64_t)))
                return 0;
            return frame_instr(l, f) == pos->instr;
        }
    return 0;
}
