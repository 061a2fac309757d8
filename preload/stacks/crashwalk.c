/* A crash's stacks (stack.h), read from a signal handler: the native
 * frames of the context it interrupted, and the thread's Python frames.
 * No lock is taken, nothing is allocated or interned, and every read of
 * the program's memory is probed first (a fault inside the handler would
 * end the report). */
#include "stack_int.h"

#include <string.h>
#include <ucontext.h>

#include "probe.h"

/* n bytes at p + off into out; 0 when that memory cannot be read */
static int crash_rd(const void *p, ptrdiff_t off, void *out, size_t n)
{
    const char *a = (const char *)p + off;
    if (!p || !cs_probe_read(a, n))
        return 0;
    memcpy(out, a, n);
    return 1;
}
#define CRD(p, off, var) crash_rd((p), (off), &(var), sizeof(var))

int cs_stack_crash_native(const void *ucv, cs_crash_walk *w)
{
    /* static: the handler may run on a small alternate stack (faulthandler's) */
    static ucontext_t uc;
    static unw_cursor_t cur;
    memcpy(&uc, ucv, sizeof uc);
    greg_t *g = uc.uc_mcontext.gregs;
    int flags = 1; /* UNW_INIT_SIGNAL_FRAME: the pc is the instruction itself */
    w->n = 0;
    w->sigframe = w->eval_at = -1;
    w->in_unwinder = unw_lo < unw_hi && (uintptr_t)g[REG_RIP] >= unw_lo &&
                     (uintptr_t)g[REG_RIP] < unw_hi;
    if (g[REG_RIP] == 0) {
        /* a call through NULL: its caller's return address is on top of
         * the stack; the walk goes on from there as if 0 had returned */
        uint64_t ret;
        w->ip[w->n] = 0;
        w->exact[w->n++] = 1;
        if (!CRD((const void *)(uintptr_t)g[REG_RSP], 0, ret))
            return w->n;
        g[REG_RIP] = (greg_t)ret;
        g[REG_RSP] += 8;
        flags = 0;
    }
    /* libunwind faulting inside its own crash would end the report */
    if (!unw_cur_init2 || !unw_cur_step || !unw_cur_reg || w->in_unwinder ||
        unw_cur_init2(&cur, (unw_context_t *)&uc, flags) < 0) {
        w->ip[w->n] = (uint64_t)g[REG_RIP];
        w->exact[w->n++] = (uint8_t)flags;
        return w->n;
    }
    int exact = flags;
    do {
        unw_word_t ip = 0, sp = 0;
        if (unw_cur_reg(&cur, UNW_REG_IP, &ip) < 0 || !ip)
            break;
        /* the kernel's signal frame: a handler returns into the
         * trampoline at its start, `mov $15,%rax; syscall` (rt_sigreturn),
         * and the stack pointer there is the frame's ucontext */
        static const unsigned char sigreturn[9] = {0x48, 0xc7, 0xc0, 0x0f, 0, 0, 0, 0x0f, 0x05};
        unsigned char code[9];
        int tramp = w->n > 0 && crash_rd((const void *)ip, 0, code, sizeof code) &&
                    !memcmp(code, sigreturn, sizeof code);
        if (tramp && w->sigframe < 0 && unw_cur_reg(&cur, UNW_REG_SP, &sp) == 0)
            w->sigframe = w->n, w->sigframe_sp = sp;
        if (w->eval_at < 0 && ip > eval_lo && ip <= eval_hi)
            w->eval_at = w->n;
        w->ip[w->n] = ip;
        w->exact[w->n++] = (uint8_t)exact;
        /* after a signal frame comes the instruction it interrupted */
        exact = tramp;
    } while (w->n < CS_CRASH_FRAMES && unw_cur_step(&cur) > 0);
    return w->n;
}

/* a str's ASCII text into out, "?" when it is anything else */
static void crash_str(const void *s, char *out, size_t n)
{
    const cs_pylayout *l = cs_py.layout;
    uint32_t state = 0;
    size_t i = 0;
    if (CRD(s, l->str_state, state) && (state & STR_COMPACT_ASCII) == STR_COMPACT_ASCII) {
        const char *p = (const char *)s + l->str_data;
        for (; i + 1 < n; i++) {
            /* one probe a page */
            if ((i == 0 || ((uintptr_t)(p + i) & 4095) == 0) && !cs_probe_read(p + i, 1))
                break;
            if (!(out[i] = p[i]))
                return;
        }
    }
    if (!i)
        out[i++] = '?';
    out[i] = 0;
}

int cs_stack_crash_python(int max, void (*fn)(void *ud, const char *file, const char *name, int line),
                          void *ud)
{
    static char file[512], name[128];
    const cs_pylayout *l = cs_py.layout;
    /* this thread's state, whether or not it holds the GIL: a read of a
     * thread-specific key, as faulthandler does from its handler */
    if (!cs_py.ok || !l || !cs_py.GILState_GetThisThreadState || !cs_py_live())
        return 0;
    const char *ts = cs_py.GILState_GetThisThreadState(), *f = NULL;
    if (ts && l->ts_cframe >= 0 && !CRD(ts, l->ts_cframe, ts))
        return 0;
    if (!ts || !CRD(ts, l->cur, f))
        return 0;
    int n = 0;
    /* code_frame's rules, each read probed; a cycle ends at 100000 */
    for (int k = 0; f && k < 100000; k++) {
        const char *co = NULL, *back = NULL, *type = NULL;
        if (!CRD(f, l->f_back, back) || !CRD(f, l->f_code, co) ||
            !(co = (const char *)((uintptr_t)co & ~(uintptr_t)l->exec_tag)) ||
            !CRD(co, l->ob_type, type))
            break;
        int lasti = -1, runs = type == cs_py.Code_Type;
        if (runs && l->model == CS_PYF_OBJECT) {
            runs = CRD(f, l->f_instr, lasti);
        } else if (runs) {
            char owner = 0;
            int first = 0;
            const char *instr = NULL;
            const char *code = co + l->co_code, *arr = NULL;
            int idx = -1;
            intptr_t narr = 0;
            /* free-threaded 3.14+: the thread's own copy of the bytecode */
            if (l->co_tlbc >= 0 && CRD(co, l->co_tlbc, arr) && arr && CRD(f, l->f_tlbc, idx) &&
                CRD(arr, 0, narr) && idx >= 0 && idx < narr && !CRD(arr, 8 + 8 * idx, code))
                code = NULL;
            runs = code && CRD(f, l->f_owner, owner) &&
                   (l->owner_shim < 0 || owner < l->owner_shim) && CRD(f, l->f_instr, instr) &&
                   CRD(co, l->co_firsttraceable, first) &&
                   (owner == l->owner_gen || instr >= code + 2 * first);
            if (runs)
                lasti = (int)((instr - code) / 2);
        }
        if (runs) {
            if (n < max) {
                const void *fo = NULL, *no = NULL;
                file[0] = name[0] = 0;
                crash_str(CRD(co, l->co_filename, fo) ? fo : NULL, file, sizeof file);
                crash_str(CRD(co, l->co_name, no) ? no : NULL, name, sizeof name);
                /* pure arithmetic over the code's line table (faulthandler
                 * calls it from its handler too) */
                fn(ud, file, name, cs_py.Code_Addr2Line((void *)co, lasti * 2));
            }
            n++;
        }
        f = back;
    }
    return n;
}
