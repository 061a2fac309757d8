/* `capsan report`: the text pieces about a process: its argv for a
 * terminal, how it ended, the header above its findings, and its line in
 * the process tree (written into a growing buffer, membuf). */
#include "signame.h"

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "report_int.h"
#include "symbolize.h"

/* ---- text pieces ------------------------------------------------------------------ */

/* argv for a terminal: control bytes as \xNN, at most max bytes of it */
void report_out_args(cs_out *o, const char *const *argv, unsigned argc, int known, size_t max)
{
    if (!known) {
        cs_outf(o, "argv unknown");
        return;
    }
    size_t used = 0;
    for (unsigned i = 0; i < argc; i++) {
        for (const char *s = i ? " " : "", *a = argv[i]; *s || *a; used++) {
            if (used >= max) {
                cs_outf(o, "...");
                return;
            }
            cs_out_char(o, (unsigned char)(*s ? *s++ : *a++));
        }
    }
}

static void out_argv(cs_out *o, const cs_trace *t, size_t max)
{
    report_out_args(o, (const char *const *)t->argv, t->argc, t->has_process, max);
}

static void out_ended(cs_out *o, report_ctx *c, int brief)
{
    cs_trace *t = c->t;
    switch (c->pi.ended) {
    case CS_END_EXIT:
        cs_outf(o, "exit %d", c->pi.status);
        break;
    case CS_END_HALT:
        cs_outf(o, "halted on error, exit %d", c->pi.status);
        break;
    case CS_END_QUICK_EXIT:
        cs_outf(o, "_exit %d (leaks judged by reachability)", c->pi.status);
        break;
    case CS_END_API_EXIT:
    case CS_END_STOPPED_EXIT: /* the status is -1 when capsan did not see it */
        if (c->pi.status >= 0)
            cs_outf(o, "exit %d ", c->pi.status);
        else
            cs_outf(o, "exit ");
        cs_outf(o, "(%s)", cs_end_unchecked_why(c->pi.ended));
        break;
    case CS_END_SIGNAL: {
        const char *name = cs_sig_abbrev(c->pi.status);
        if (name)
            cs_outf(o, "signal %d (SIG%s)", c->pi.status, name);
        else
            cs_outf(o, "signal %d", c->pi.status);
        break;
    }
    default:
        if (t->has_end) { /* a newer writer's ending, or a damaged record */
            cs_outf(o, "unknown (END record with ending %u, status %d)", t->end.how, c->pi.status);
            break;
        }
        if (brief)
            cs_outf(o, "unknown (no END record: killed, or still running)");
        else
            cs_outf(o, "unknown (no END record: killed, or still running; trace read up to "
                    "offset 0x%llx, no leak check)", (unsigned long long)t->data_end);
        break;
    }
}

/* the function at the faulting pc of a signal ending, or NULL */
const char *report_end_function(report_ctx *c)
{
    static cs_frame_info fr[16];
    /* +1: the pc is the faulting instruction, not a return address */
    int n = c->t->end.pc ? cs_sym_native(c->sym, c->t->end.pc + 1, fr, 16) : 0;
    return n > 0 ? fr[n - 1].function : NULL;
}

void report_text_header(report_ctx *c, const entry *e, const entry *parent)
{
    cs_trace *t = c->t;
    cs_out *o = c->out;
    cs_outf(o, "== process %llu (", (unsigned long long)c->pi.pid);
    out_argv(o, t, 4096);
    cs_outf(o, ")");
    if (parent)
        cs_outf(o, " child of %llu,", (unsigned long long)parent->pid);
    cs_outf(o, " ended: ");
    out_ended(o, c, 0);
    cs_outf(o, " ==\n");
    (void)e;
    if (c->pi.ended == CS_END_SIGNAL && t->end.pc) {
        const char *fn = report_end_function(c);
        cs_outf(o, "   at pc 0x%llx", (unsigned long long)t->end.pc);
        if (fn) {
            o->write(o->ud, " in ", 4);
            o->write(o->ud, fn, strlen(fn));
        }
        int fault = t->end.status == SIGSEGV || t->end.status == SIGBUS ||
                    t->end.status == SIGILL || t->end.status == SIGFPE;
        if (fault) /* a signal sent (abort(), kill) has no fault address */
            cs_outf(o, ", fault address 0x%llx", (unsigned long long)t->end.fault_addr);
        cs_outf(o, "\n");
    }
    if (c->pi.ended == CS_END_SIGNAL && (t->crash_nnative || t->crash_npy)) {
        cs_frame_info fr[REPORT_CRASH_FRAMES];
        int n = report_crash_frames(c, fr, REPORT_CRASH_FRAMES);
        cs_outf(o, "   the crashing thread (%llu):\n", (unsigned long long)t->crash_tid);
        for (int k = 0; k < n; k++)
            cs_render_text_frame(o, k, &fr[k]);
    }
}

/* The crash's stack as the live crash report printed it: native frames
 * down to the eval loop (inlined calls named), then the Python frames. */
int report_crash_frames(report_ctx *c, cs_frame_info *out, int max)
{
    cs_trace *t = c->t;
    int n = 0;
    for (size_t i = 0; i < t->crash_nnative && n < max; i++) {
        /* the pc is the instruction itself, the others return addresses */
        int k = cs_sym_native(c->sym, t->crash_ips[i] + (i == 0), out + n, max - n);
        int eval = 0;
        for (int j = 0; j < k; j++)
            eval |= out[n + j].function && !strcmp(out[n + j].function, "_PyEval_EvalFrameDefault");
        if (eval && t->crash_npy)
            break; /* the Python frames tell the rest */
        if (i == 0)
            for (int j = 0; j < k; j++)
                out[n + j].address = t->crash_ips[0];
        n += k;
    }
    for (size_t i = 0; i < t->crash_npy && n < max; i++)
        out[n++] = t->crash_py[i];
    return n;
}

/* "PID ARGV: ENDED; E error(s), W warning(s)" for the process tree */
void report_mem_write(void *ud, const char *s, size_t n)
{
    membuf *m = ud;
    if (m->n + n + 1 > m->cap) {
        m->cap = (m->n + n + 1) * 2;
        char *p = realloc(m->s, m->cap);
        if (!p) {
            fputs("capsan: out of memory\n", stderr);
            exit(1);
        }
        m->s = p;
    }
    memcpy(m->s + m->n, s, n);
    m->n += n;
    m->s[m->n] = 0;
}

char *report_tree_line(report_ctx *c)
{
    membuf m = {0};
    cs_out o = {.write = report_mem_write, .ud = &m};
    cs_outf(&o, "%llu ", (unsigned long long)c->pi.pid);
    out_argv(&o, c->t, 100);
    cs_outf(&o, ": ");
    out_ended(&o, c, 1);
    cs_outf(&o, "; %u error(s), %u warning(s)", c->sum.errors, c->sum.warnings);
    if (c->sum.leaked_bytes)
        cs_outf(&o, ", %llu byte(s) leaked", (unsigned long long)c->sum.leaked_bytes);
    if (c->t->error)
        cs_outf(&o, " [corrupt trace]");
    return m.s;
}
