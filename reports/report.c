/* `capsan report`: read any number of traces (each in one pass, reader.h),
 * order them as a process tree (children after their parents, by start
 * time), and render every process's findings as text, JSON, HTML, or as
 * suppression lines (--gen-suppressions).
 *
 * Text follows LeakSanitizer: errors as they were found, then leaks
 * grouped by kind and the stack of their first event, largest first, at
 * most max_findings blocks per process ("Omitting N more finding(s).").
 * JSON always holds every finding. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "report.h"
#include "usage.h"
#include "options.h"
#include "util.h"
#include "html.h"
#include "json.h"
#include "reader.h"
#include "leakgroups.h"
#include "savedreport.h"
#include "render.h"
#include "suppress.h"
#include "symbolize.h"

enum { FMT_TEXT, FMT_JSON, FMT_HTML, FMT_SUPP };

/* One trace named on the command line. */
typedef struct entry {
    const char *path;
    size_t argi;              /* position on the command line */
    int has_hdr;
    int json_report;          /* a report=json file (log_path.PID.json), not a trace */
    int saved;                /* JSON of another kind: a pytest report (savedreport.h) */
    uint64_t pid, ppid, start;
    long parent;              /* index into the entries, or -1 */
    int depth;
    /* after reporting, for the process tree */
    int done, unreadable;
    char *line;               /* "PID ARGV: ENDED; N error(s)..." */
} entry;

typedef struct report_ctx {
    cs_trace *t;
    cs_symbolizer *sym;
    cs_stack_source src;
    cs_proc_info pi;
    cs_summary sum;
    cs_suppressions *supp;    /* for this trace: flag_supp, or the run's own */
    cs_suppressions *flag_supp; /* --suppressions */
    cs_out *out;
    int format;
    cs_json json;
    cs_html *html;
    long max_flag;            /* --max-findings, -1 if not given */
    long max;                 /* this process's limit; 0 = all */
    unsigned shown, omitted;
    cs_leak_groups groups;    /* leaks (text) */
    /* --gen-suppressions: lines printed so far (a set) */
    char **lines;
    size_t lcap, ln;
    unsigned gen_findings, gen_unnamed;
} report_ctx;





static uint64_t hash_str(const char *s)
{
    uint64_t h = 1469598103934665603ull;
    for (; *s; s++)
        h = (h ^ (unsigned char)*s) * 1099511628211ull;
    return h;
}

/* ---- stack source ---------------------------------------------------------- */

static int src_raw(void *ud, uint32_t stack, uint64_t *values, int max)
{
    return cs_trace_stack(((report_ctx *)ud)->t, stack, values, max);
}

static int src_native(void *ud, uint64_t ip, cs_frame_info *out, int max)
{
    return cs_sym_native(((report_ctx *)ud)->sym, ip, out, max);
}

static int src_code(void *ud, uint32_t code_id, const char **file, const char **name)
{
    const cs_code_rec *c = cs_trace_code(((report_ctx *)ud)->t, code_id);
    if (!c)
        return 0;
    *file = c->file;
    *name = c->name;
    return 1;
}

/* ---- leak groups ------------------------------------------------------------- */

static void group_add(report_ctx *c, const cs_finding *f)
{
    if (cs_lg_add(&c->groups, f) != 0) {
        fprintf(stderr, "capsan: out of memory\n");
        exit(1);
    }
}

static void groups_render(report_ctx *c)
{
    const cs_leak_group **v;
    size_t n = cs_lg_sorted(&c->groups, &v);
    if (!n && c->groups.n) {
        fprintf(stderr, "capsan: out of memory\n");
        exit(1);
    }
    for (size_t i = 0; i < n; i++) {
        if (c->max && c->shown >= (unsigned long)c->max) {
            c->omitted += v[i]->count;
            continue;
        }
        if (c->format == FMT_HTML)
            cs_html_leak_group(c->html, v[i], &c->src);
        else
            cs_render_text_leak_group(c->out, &c->pi, v[i], &c->src);
        c->shown++;
    }
    free(v);
    cs_lg_clear(&c->groups);
}

/* ---- --gen-suppressions --------------------------------------------------------- */

/* 1 when line is new (and now remembered) */
static int line_add(report_ctx *c, const char *line)
{
    if ((c->ln + 1) * 2 > c->lcap) {
        size_t ncap = c->lcap ? c->lcap * 2 : 64;
        char **n = cs_xcalloc(ncap, sizeof *n);
        for (size_t i = 0; i < c->lcap; i++) {
            if (!c->lines[i])
                continue;
            size_t j = hash_str(c->lines[i]) & (ncap - 1);
            while (n[j])
                j = (j + 1) & (ncap - 1);
            n[j] = c->lines[i];
        }
        free(c->lines);
        c->lines = n;
        c->lcap = ncap;
    }
    size_t j = hash_str(line) & (c->lcap - 1);
    while (c->lines[j]) {
        if (strcmp(c->lines[j], line) == 0)
            return 0;
        j = (j + 1) & (c->lcap - 1);
    }
    if (!(c->lines[j] = strdup(line))) {
        fputs("capsan: out of memory\n", stderr);
        exit(1);
    }
    c->ln++;
    return 1;
}

static void gen_suppression(report_ctx *c, const cs_finding *f)
{
    char line[1024], msg[512];
    c->gen_findings++;
    cs_finding_message(f, msg, sizeof msg);
    /* the comment says what the line is for: keep it on one line */
    for (char *s = msg; *s; s++)
        if ((unsigned char)*s < 0x20)
            *s = ' ';
    if (!cs_supp_generate(f, &c->src, line, sizeof line)) {
        c->gen_unnamed++;
        cs_outf(c->out, "# %s (pid %llu): no stack frame to name; not suppressible by pattern\n",
                cs_kind_name(f->kind), (unsigned long long)c->pi.pid);
        return;
    }
    if (!line_add(c, line))
        return;
    cs_outf(c->out, "# %s (pid %llu)\n", msg, (unsigned long long)c->pi.pid);
    cs_outf(c->out, "%s\n", line);
}

/* ---- findings ------------------------------------------------------------------- */

static int over_limit(report_ctx *c)
{
    return c->max && c->shown >= (unsigned long)c->max;
}

static void on_finding(void *ud, const cs_finding *f)
{
    report_ctx *c = ud;
    if (c->supp && cs_supp_match(c->supp, f, &c->src)) {
        c->sum.suppressed++;
        return;
    }
    cs_summary_add(&c->sum, f);
    switch (c->format) {
    case FMT_JSON:
        cs_json_finding(&c->json, &c->pi, f, &c->src);
        break;
    case FMT_SUPP:
        gen_suppression(c, f);
        break;
    case FMT_HTML:
        if (cs_kind_is_grouped(f->kind)) {
            group_add(c, f); /* identical leaks: one card, as the text groups them */
        } else if (over_limit(c)) {
            c->omitted++;
        } else {
            cs_html_finding(c->html, f, &c->src);
            c->shown++;
        }
        break;
    default:
        if (cs_kind_is_grouped(f->kind)) {
            group_add(c, f);
        } else if (over_limit(c)) {
            c->omitted++;
        } else {
            cs_render_text_finding(c->out, &c->pi, f, &c->src);
            c->shown++;
        }
    }
}

/* ---- the process tree ----------------------------------------------------------- */

static void read_header(entry *e)
{
    int fd = open(e->path, O_RDONLY | O_CLOEXEC | O_NONBLOCK); /* never wait on a FIFO */
    cs_file_header h;
    if (fd < 0)
        return;
    ssize_t got = pread(fd, &h, sizeof h, 0);
    if (got == (ssize_t)sizeof h && memcmp(h.magic, CS_TRACE_MAGIC, 8) == 0) {
        e->has_hdr = 1;
        e->pid = h.pid;
        e->ppid = h.ppid;
        e->start = h.start_realtime_ns;
    }
    /* `capsan report capsan.trace.*` also matches report=json's
     * capsan.trace.PID.json files (json.c's first bytes; the pytest
     * plugin's report is JSON too, but another document) */
    static const char json_start[] = "{\"tool\": \"capsan\", \"format\": 1, \"processes\": [";
    _Static_assert(sizeof json_start - 1 <= sizeof h, "the header read holds the prefix");
    if (got >= (ssize_t)sizeof json_start - 1 && memcmp(&h, json_start, sizeof json_start - 1) == 0)
        e->json_report = 1;
    close(fd);
    /* any other JSON text: the pytest plugin's report, or not capsan's */
    if (!e->has_hdr && !e->json_report)
        e->saved = cs_saved_sniff(e->path);
}

/* (start, position) orders processes */
static int before(const entry *a, const entry *b)
{
    return a->start < b->start || (a->start == b->start && a->argi < b->argi);
}

/* j may be i's parent: it has i's ppid and did not start after it (a tie,
 * as in synthetic traces, counts unless the two name each other) */
static int may_parent(const entry *j, const entry *i)
{
    if (j == i || !j->has_hdr || !i->has_hdr || j->pid != i->ppid || j->start > i->start)
        return 0;
    return j->start < i->start || j->ppid != i->pid || j->argi < i->argi;
}

static entry **g_sort_entries;
static int child_cmp(const void *x, const void *y)
{
    const entry *a = g_sort_entries[*(const size_t *)x], *b = g_sort_entries[*(const size_t *)y];
    return before(a, b) ? -1 : before(b, a) ? 1 : 0;
}

/* Depth-first order: roots by start time, each followed by its children.
 * Damaged input may link processes in a cycle: its first member then
 * becomes a root, so every entry appears exactly once. */
static size_t *tree_order(entry *e, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        e[i].parent = -1;
        for (size_t j = 0; j < n; j++)
            /* pid reuse: the latest candidate that started before */
            if (may_parent(&e[j], &e[i]) && (e[i].parent < 0 || before(&e[e[i].parent], &e[j])))
                e[i].parent = (long)j;
    }
    entry **ptrs = cs_xcalloc(n, sizeof *ptrs);
    for (size_t i = 0; i < n; i++)
        ptrs[i] = &e[i];
    g_sort_entries = ptrs;
    size_t *order = cs_xcalloc(n, sizeof *order), *idx = cs_xcalloc(n, sizeof *idx);
    for (size_t i = 0; i < n; i++)
        idx[i] = i;
    qsort(idx, n, sizeof *idx, child_cmp);
    char *seen = cs_xcalloc(n, 1);
    size_t *stack = cs_xcalloc(n, sizeof *stack), sp = 0, k = 0;
    for (int pass = 0; pass < 2; pass++) {
        for (size_t r = 0; r < n; r++) {
            size_t root = idx[r];
            if (seen[root] || (pass == 0 && e[root].parent >= 0))
                continue;
            e[root].parent = -1;    /* pass 1: a cycle's first member */
            seen[root] = 1;
            stack[sp++] = root;
            while (sp) {
                size_t i = stack[--sp];
                order[k++] = i;
                e[i].depth = e[i].parent >= 0 ? e[e[i].parent].depth + 1 : 0;
                for (size_t q = n; q-- > 0;)
                    if (e[idx[q]].parent == (long)i && !seen[idx[q]]) {
                        seen[idx[q]] = 1;
                        stack[sp++] = idx[q];
                    }
            }
        }
    }
    free(seen);
    free(stack);
    free(idx);
    free(ptrs);
    g_sort_entries = NULL;
    return order;
}

/* ---- text pieces ------------------------------------------------------------------ */

/* argv for a terminal: control bytes as \xNN, at most max bytes of it */
static void out_args(cs_out *o, const char *const *argv, unsigned argc, int known, size_t max)
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
    out_args(o, (const char *const *)t->argv, t->argc, t->has_process, max);
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
        const char *name = sigabbrev_np(c->pi.status);
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
static const char *end_function(report_ctx *c)
{
    static cs_frame_info fr[16];
    /* +1: the pc is the faulting instruction, not a return address */
    int n = c->t->end.pc ? cs_sym_native(c->sym, c->t->end.pc + 1, fr, 16) : 0;
    return n > 0 ? fr[n - 1].function : NULL;
}

static void text_header(report_ctx *c, const entry *e, const entry *parent)
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
        const char *fn = end_function(c);
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
}

/* "PID ARGV: ENDED; E error(s), W warning(s)" for the process tree */
typedef struct membuf {
    char *s;
    size_t n, cap;
} membuf;

static void mem_write(void *ud, const char *s, size_t n)
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

static char *tree_line(report_ctx *c)
{
    membuf m = {0};
    cs_out o = {.write = mem_write, .ud = &m};
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

static void text_tree(cs_out *o, entry *e, const size_t *order, size_t n)
{
    size_t shown = 0;
    for (size_t k = 0; k < n; k++)
        shown += e[order[k]].done && e[order[k]].line;
    if (shown < 2)
        return;
    cs_outf(o, "== process tree (%zu processes) ==\n", shown);
    for (size_t k = 0; k < n; k++) {
        const entry *x = &e[order[k]];
        if (!x->line)
            continue;
        /* one guide per ancestor level: "|   " while that level has more
         * children below, then "|-- " or "`-- " for this one */
        for (int d = 1; d <= x->depth; d++) {
            int more = 0;
            for (size_t j = k + 1; j < n; j++) {
                int dj = e[order[j]].depth;
                if (dj < d)
                    break;
                if (dj == d) {
                    more = 1;
                    break;
                }
            }
            if (d < x->depth)
                cs_outf(o, "%s", more ? "|   " : "    ");
            else
                cs_outf(o, "%s", more ? "|-- " : "`-- ");
        }
        cs_outf(o, "%s\n", x->line);
    }
    cs_outf(o, "\n");
}

/* ---- one trace ----------------------------------------------------------------------- */

static long limit_for(report_ctx *c)
{
    if (c->max_flag >= 0)
        return c->max_flag;
    if (c->t->opt_max_findings >= 0)
        return c->t->opt_max_findings;
    const char *d = cs_option_default("max_findings");
    return d ? atol(d) : 100;
}

static int report_one(entry *e, const entry *parent, report_ctx *c, FILE *errf)
{
    char err[600];
    const char *path = e->path;
    cs_trace *t = cs_trace_open(path, err, sizeof err);
    e->done = 1;
    if (!t) {
        fprintf(stderr, "capsan: %s\n", err);
        if (errf)
            fprintf(errf, "capsan: %s\n", err);
        if (c->format == FMT_HTML)
            cs_html_unreadable(c->html, path, err);
        e->unreadable = 1;
        return 1;
    }
    c->t = t;
    c->sym = cs_sym_create(t->modules, t->nmodules, t->exe);
    c->src = (cs_stack_source){ .ud = c, .raw = src_raw, .native = src_native, .code = src_code };
    cs_trace_proc_info(t, &c->pi);
    memset(&c->sum, 0, sizeof c->sum);
    c->shown = c->omitted = 0;
    c->max = limit_for(c);
    /* without --suppressions, the run's own file: the report then shows
     * what the live report showed */
    cs_suppressions *run_supp = NULL;
    if (!c->flag_supp && t->opt_suppressions) {
        char serr[600];
        if (!(run_supp = cs_supp_load(t->opt_suppressions, serr, sizeof serr)))
            fprintf(stderr, "capsan: %s: the run's suppressions are not applied: %s\n", path, serr);
    }
    c->supp = c->flag_supp ? c->flag_supp : run_supp;

    if (t->error) {
        fprintf(stderr, "capsan: %s\n", t->errmsg);
        if (errf)
            fprintf(errf, "capsan: %s\n", t->errmsg);
    }
    if (t->trailing_offset)
        fprintf(stderr, "capsan: %s: note: data after the end-of-data marker at offset 0x%llx "
                "ignored (a writer stopped mid-record)\n", path,
                (unsigned long long)t->trailing_offset);

    uint64_t parent_pid = parent ? parent->pid : 0;
    switch (c->format) {
    case FMT_JSON: {
        cs_json_proc jp = {
            .info = &c->pi, .argv = (const char *const *)t->argv, .argc = t->argc,
            .exe = t->exe, .trace = path, .error = t->error ? t->errmsg : NULL,
            .end_time_ns = t->has_end ? t->end.time_ns : 0, .parent_pid = parent_pid,
            .counts = t->counts, .ncounts = t->ncounts, .counts_records = t->counts_records,
            .counts_stride = t->counts_stride,
        };
        cs_json_process_begin(&c->json, &jp);
        break;
    }
    case FMT_HTML: {
        cs_html_proc hp = {
            .info = &c->pi, .argv = (const char *const *)t->argv, .argc = t->argc,
            .exe = t->exe, .trace = path, .error = t->error ? t->errmsg : NULL,
            .end_time_ns = t->has_end ? t->end.time_ns : 0,
            .end_pc = t->has_end ? t->end.pc : 0, .end_fault_addr = t->end.fault_addr,
            .end_function = c->pi.ended == CS_END_SIGNAL ? end_function(c) : NULL,
            .parent_pid = parent_pid, .depth = e->depth, .data_end = t->data_end,
            .truncated = !t->has_end, .counts = t->counts, .ncounts = t->ncounts,
            .counts_records = t->counts_records, .counts_stride = t->counts_stride,
        };
        cs_html_process_begin(c->html, &hp);
        break;
    }
    case FMT_TEXT:
        text_header(c, e, parent);
        break;
    }
    cs_trace_replay(t, on_finding, c);
    c->sum.events = cs_trace_events_observed(t);
    switch (c->format) {
    case FMT_JSON:
        cs_json_process_end(&c->json, &c->sum);
        break;
    case FMT_HTML:
        groups_render(c);
        cs_html_omitted(c->html, c->omitted, c->max);
        cs_html_process_end(c->html, &c->sum);
        break;
    case FMT_TEXT:
        groups_render(c);
        cs_render_text_omitted(c->out, 0, c->omitted, c->max);
        cs_supp_render_used(run_supp, c->out);
        cs_render_text_summary(c->out, &c->pi, &c->sum);
        cs_outf(c->out, "\n");
        break;
    }
    e->line = tree_line(c);
    cs_supp_free(run_supp);
    c->supp = NULL;
    int rc = t->error ? 1 : 0;
    cs_sym_destroy(c->sym);
    cs_trace_close(t);
    c->t = NULL;
    c->sym = NULL;
    return rc;
}

/* ---- one pytest report -------------------------------------------------------------- */

/* the test of the finding being written (JSON's "test" and "allowed") */
typedef struct saved_cur {
    const char *nodeid;
    int allowed;
} saved_cur;

static void saved_extra(void *ud, cs_out *o)
{
    const saved_cur *cur = ud;
    cs_outf(o, ", \"test\": ");
    cs_json_string(o, cur->nodeid);
    cs_outf(o, ", \"allowed\": %s", cur->allowed ? "true" : "false");
}

static char *saved_tree_line(report_ctx *c, const cs_saved *s)
{
    membuf m = {0};
    cs_out o = {.write = mem_write, .ud = &m};
    cs_outf(&o, "%llu ", (unsigned long long)c->pi.pid);
    out_args(&o, s->argv, s->argc, s->argc > 0, 100);
    cs_outf(&o, ": pytest report; %u error(s), %u warning(s)", c->sum.errors, c->sum.warnings);
    if (c->sum.leaked_bytes)
        cs_outf(&o, ", %llu byte(s) leaked", (unsigned long long)c->sum.leaked_bytes);
    return m.s;
}

/* "test_x.py::test_y: 2 finding(s), 1 allowed" */
static void saved_test_title(cs_out *o, const cs_saved *s, const cs_saved_test *t)
{
    unsigned allowed = 0;
    for (size_t i = t->first; i < t->first + t->n; i++)
        allowed += s->allowed[i];
    if (t->nodeid) {
        cs_outf(o, "test ");
        for (const char *p = t->nodeid; *p; p++)
            cs_out_char(o, (unsigned char)*p);
    } else {
        cs_outf(o, "outside any test");
    }
    cs_outf(o, ": %zu finding(s)", t->n);
    if (allowed)
        cs_outf(o, ", %u allowed by the test", allowed);
}

/* A pytest report renders as a trace does, one process, its findings
 * under the test they came from (leaks grouped within each test). */
static int report_saved(entry *e, report_ctx *c, FILE *errf)
{
    char err[700];
    cs_saved *s = cs_saved_open(e->path, err, sizeof err);
    e->done = 1;
    if (!s) {
        fprintf(stderr, "capsan: %s\n", err);
        if (errf)
            fprintf(errf, "capsan: %s\n", err);
        if (c->format == FMT_HTML)
            cs_html_unreadable(c->html, e->path, err);
        e->unreadable = 1;
        return 1;
    }
    if (s->skipped)
        fprintf(stderr, "capsan: %s: %u finding(s) of kinds this capsan does not know were "
                "skipped (a newer capsan wrote the report)\n", e->path, s->skipped);
    c->src = cs_saved_source(s);
    /* the plugin judged in scopes, and pytest's status is the one known */
    memset(&c->pi, 0, sizeof c->pi);
    c->pi.pid = s->pid;
    c->pi.ppid = s->ppid;
    c->pi.ended = CS_END_API_EXIT;
    c->pi.status = s->status;
    /* event times count from the first one recorded (the process's start
     * is not in the report) */
    for (size_t i = 0; i < s->nfindings; i++)
        for (unsigned k = 0; k < s->findings[i].nevents && k < CS_FINDING_MAX_EVENTS; k++) {
            uint64_t t = s->findings[i].events[k].time_ns;
            if (t && (!c->pi.start_mono_ns || t < c->pi.start_mono_ns))
                c->pi.start_mono_ns = t;
        }
    memset(&c->sum, 0, sizeof c->sum);
    c->shown = c->omitted = 0;
    if (c->max_flag >= 0) {
        c->max = c->max_flag;
    } else {
        const char *d = cs_option_default("max_findings");
        c->max = d ? atol(d) : 100;
    }
    c->supp = c->flag_supp;
    saved_cur cur = {0};
    switch (c->format) {
    case FMT_JSON: {
        cs_json_proc jp = {.info = &c->pi, .argv = s->argv, .argc = s->argc, .exe = s->exe,
                           .trace = e->path};
        cs_json_process_begin(&c->json, &jp);
        c->json.finding_extra = saved_extra;
        c->json.extra_ud = &cur;
        break;
    }
    case FMT_HTML: {
        cs_html_proc hp = {.info = &c->pi, .argv = s->argv, .argc = s->argc, .exe = s->exe,
                           .trace = e->path, .depth = e->depth, .saved = 1};
        cs_html_process_begin(c->html, &hp);
        break;
    }
    case FMT_TEXT: {
        cs_out *o = c->out;
        cs_outf(o, "== process %llu (", (unsigned long long)c->pi.pid);
        out_args(o, s->argv, s->argc, s->argc > 0, 4096);
        cs_outf(o, ") pytest report: %zu traced test(s), %zu with findings", s->ntraced,
                s->ntests && !s->tests[s->ntests - 1].nodeid ? s->ntests - 1 : s->ntests);
        if (s->status >= 0)
            cs_outf(o, "; pytest exit status %d", s->status);
        cs_outf(o, " ==\n");
        break;
    }
    }
    for (size_t k = 0; k < s->ntests; k++) {
        const cs_saved_test *t = &s->tests[k];
        if (c->format == FMT_TEXT || c->format == FMT_HTML) {
            membuf m = {0};
            cs_out mo = {.write = mem_write, .ud = &m};
            saved_test_title(&mo, s, t);
            if (c->format == FMT_TEXT)
                cs_outf(c->out, "-- %s\n", m.s);
            else
                cs_html_heading(c->html, m.s);
            free(m.s);
        }
        cur.nodeid = t->nodeid;
        for (size_t i = t->first; i < t->first + t->n; i++) {
            cur.allowed = s->allowed[i];
            on_finding(c, &s->findings[i]);
        }
        if (c->format == FMT_TEXT || c->format == FMT_HTML)
            groups_render(c);
    }
    switch (c->format) {
    case FMT_JSON:
        c->json.finding_extra = NULL;
        cs_json_process_end(&c->json, &c->sum);
        break;
    case FMT_HTML:
        cs_html_omitted(c->html, c->omitted, c->max);
        cs_html_process_end(c->html, &c->sum);
        break;
    case FMT_TEXT:
        cs_render_text_omitted(c->out, 0, c->omitted, c->max);
        cs_render_text_summary(c->out, &c->pi, &c->sum);
        cs_outf(c->out, "\n");
        break;
    }
    e->line = saved_tree_line(c, s);
    c->supp = NULL;
    cs_saved_close(s);
    return 0;
}

static void file_write(void *ud, const char *s, size_t n)
{
    fwrite(s, 1, n, (FILE *)ud);
}

int cs_report_text_one(const char *path, FILE *out)
{
    entry e = {.path = path, .parent = -1};
    read_header(&e);
    cs_out o = {.write = file_write, .ud = out};
    report_ctx c = {.format = FMT_TEXT, .max_flag = -1, .out = &o};
    int rc = report_one(&e, NULL, &c, NULL);
    fflush(out);
    for (size_t i = 0; i < c.lcap; i++)
        free(c.lines[i]);
    free(c.lines);
    cs_lg_free(&c.groups);
    free(e.line);
    return rc;
}

/* A trace named twice (a shell glob and an explicit path, a symlink) is
 * reported once: its process would otherwise appear twice in the tree. */
static size_t drop_repeats(entry *ents, size_t n)
{
    size_t kept = 0;
    struct stat *st = cs_xcalloc(n, sizeof *st);
    for (size_t i = 0; i < n; i++) {
        int known = stat(ents[i].path, &st[kept]) == 0;
        size_t j = 0;
        /* an entry that could not be stat'ed has inode 0: it matches nothing */
        while (known && j < kept && !(st[j].st_ino && st[j].st_dev == st[kept].st_dev &&
                                      st[j].st_ino == st[kept].st_ino))
            j++;
        if (known && j < kept) {
            fprintf(stderr, "capsan: %s is the same file as %s: reported once\n", ents[i].path,
                    ents[j].path);
            continue;
        }
        if (!known) /* reported as it is (cannot open) further on */
            memset(&st[kept], 0, sizeof st[kept]);
        ents[kept] = ents[i];
        ents[kept].argi = kept;
        kept++;
    }
    free(st);
    return kept;
}

/* -o must not destroy a trace: neither one of those being read (it is
 * truncated before it is read), nor any other (`-o capsan.trace.*`: the
 * shell made the first trace the output). */
static void check_output(const char *outpath, const entry *ents, size_t n)
{
    struct stat out, st;
    if (stat(outpath, &out) != 0 || !S_ISREG(out.st_mode))
        return;                     /* new, or a device such as /dev/stdout */
    for (size_t i = 0; i < n; i++)
        if (stat(ents[i].path, &st) == 0 && st.st_dev == out.st_dev && st.st_ino == out.st_ino)
            cs_usage_error("report: -o %s is also a trace to report: writing the report "
                           "would destroy it", outpath);
    int fd = open(outpath, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    char magic[8];
    if (fd >= 0 && read(fd, magic, sizeof magic) == (ssize_t)sizeof magic &&
        memcmp(magic, CS_TRACE_MAGIC, sizeof magic) == 0) {
        close(fd);
        cs_usage_error("report: -o %s is a capsan trace: refusing to overwrite it "
                       "(did a glob follow -o?)", outpath);
    }
    if (fd >= 0)
        close(fd);
}

int cs_cmd_report(int argc, char **argv)
{
    int format = FMT_TEXT, gen = 0;
    long max_flag = -1;
    const char *outpath = NULL, *supppath = NULL;
    entry *ents = cs_xcalloc((size_t)argc + 1, sizeof *ents);
    size_t n = 0;
    int rest = 0;
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i];
        if (rest || a[0] != '-' || strcmp(a, "-") == 0) {
            if (!*a) /* an unset shell variable */
                cs_usage_error("report: an empty trace file name");
            if (!rest && strcmp(a, "-") == 0) /* a trace is mapped, not streamed */
                cs_usage_error("report: traces are read from files, not from standard input "
                               "('-'); name the trace file (./- for a file called '-')");
            ents[n].path = argv[i];
            ents[n].argi = n;
            n++;
        } else if (strcmp(a, "--") == 0) {
            rest = 1;
        } else if (strcmp(a, "-h") == 0 || strcmp(a, "--help") == 0) {
            fputs(cs_usage_text, stdout);
            free(ents);
            return 0;
        } else if (strncmp(a, "--format", 8) == 0 && (a[8] == 0 || a[8] == '=')) {
            const char *v = cs_flag_value(argc, argv, &i, "--format");
            if (strcmp(v, "text") == 0)
                format = FMT_TEXT;
            else if (strcmp(v, "json") == 0)
                format = FMT_JSON;
            else if (strcmp(v, "html") == 0)
                format = FMT_HTML;
            else
                cs_usage_error("report: unknown format '%s' (text, json or html)", v);
        } else if (strcmp(a, "-o") == 0) {
            if (!*(outpath = cs_flag_value(argc, argv, &i, "-o")))
                cs_usage_error("report: -o needs a file name");
        } else if (strncmp(a, "--output", 8) == 0 && (a[8] == 0 || a[8] == '=')) {
            if (!*(outpath = cs_flag_value(argc, argv, &i, "--output")))
                cs_usage_error("report: --output needs a file name");
        } else if (strncmp(a, "--suppressions", 14) == 0 && (a[14] == 0 || a[14] == '=')) {
            if (!*(supppath = cs_flag_value(argc, argv, &i, "--suppressions")))
                cs_usage_error("report: --suppressions needs a file name");
        } else if (strncmp(a, "--max-findings", 14) == 0 && (a[14] == 0 || a[14] == '=')) {
            const char *v = cs_flag_value(argc, argv, &i, "--max-findings");
            char *end;
            errno = 0;
            max_flag = strtol(v, &end, 10);
            if (!*v || *end || errno || max_flag < 0)
                cs_usage_error("report: --max-findings wants a number >= 0 (0: all), got '%s'", v);
        } else if (strcmp(a, "--gen-suppressions") == 0) {
            gen = 1;
        } else {
            cs_usage_error("report: unknown flag '%s'", a);
        }
    }
    if (!n)
        cs_usage_error("report: no trace files given (capsan report [flags] TRACE...)");
    n = drop_repeats(ents, n);
    if (gen)
        format = FMT_SUPP;

    report_ctx c = { .format = format, .max_flag = max_flag };
    if (supppath) {
        char err[600];
        c.flag_supp = cs_supp_load(supppath, err, sizeof err);
        if (!c.flag_supp)
            cs_usage_error("report: %s", err);
    }
    if (outpath)
        check_output(outpath, ents, n);
    FILE *out = stdout;
    if (outpath && !(out = fopen(outpath, "w"))) {
        int e = errno;
        char dir[4096] = ".";
        const char *slash = strrchr(outpath, '/');
        struct stat st;
        if (slash)
            snprintf(dir, sizeof dir, "%.*s", slash == outpath ? 1 : (int)(slash - outpath), outpath);
        if (e == ENOENT && stat(dir, &st) != 0)
            cs_usage_error("report: cannot write the report to %s: directory %s does not exist",
                           outpath, dir);
        cs_usage_error("report: cannot write the report to %s: %s", outpath, strerror(e));
    }
    cs_out o = {
        .write = file_write, .ud = out,
        .color = !outpath && format == FMT_TEXT && isatty(fileno(stdout)) && !getenv("NO_COLOR"),
    };
    c.out = &o;

    for (size_t i = 0; i < n; i++)
        read_header(&ents[i]);
    size_t *order = tree_order(ents, n);

    int rc = 0;
    if (format == FMT_JSON)
        cs_json_begin(&c.json, &o);
    if (format == FMT_HTML) {
        char err[300];
        if (!(c.html = cs_html_begin(out, err, sizeof err))) {
            fprintf(stderr, "capsan: %s\n", err);
            rc = 1;
            goto done;
        }
    }
    if (format == FMT_SUPP)
        cs_outf(&o, "# capsan suppressions (capsan report --gen-suppressions): one KIND:pattern "
                "line per finding;\n# use with capsan report --suppressions FILE or "
                "CAPSAN_OPTIONS=suppressions=FILE\n");
    for (size_t k = 0; k < n; k++) {
        entry *e = &ents[order[k]];
        const entry *parent = e->parent >= 0 ? &ents[e->parent] : NULL;
        if (e->json_report) {
            fprintf(stderr, "capsan: %s is a JSON report (report=json), not a trace: skipped\n",
                    e->path);
            continue;
        }
        if (e->saved) {
            rc |= report_saved(e, &c, format == FMT_TEXT && outpath ? out : NULL);
            continue;
        }
        rc |= report_one(e, parent, &c, format == FMT_TEXT && outpath ? out : NULL);
    }
    switch (format) {
    case FMT_JSON:
        cs_json_end(&c.json);
        break;
    case FMT_HTML:
        if (cs_html_end(c.html) != 0) {
            fprintf(stderr, "capsan: writing the HTML page failed: %s\n", strerror(errno));
            rc = 1;
        }
        break;
    case FMT_SUPP:
        cs_outf(&o, "# %u finding(s), %zu distinct line(s)", c.gen_findings, c.ln);
        if (c.gen_unnamed)
            cs_outf(&o, ", %u without a stack to name", c.gen_unnamed);
        cs_outf(&o, "\n");
        break;
    default:
        cs_supp_render_used(c.flag_supp, &o);
        text_tree(&o, ents, order, n);
    }

done:
    if (fflush(out) != 0 || ferror(out)) {
        fprintf(stderr, "capsan: writing %s failed: %s\n", outpath ? outpath : "the report",
                strerror(errno));
        rc = 1;
    }
    if (out != stdout)
        fclose(out);
    cs_supp_free(c.flag_supp);
    for (size_t i = 0; i < c.lcap; i++)
        free(c.lines[i]);
    free(c.lines);
    cs_lg_free(&c.groups);
    for (size_t i = 0; i < n; i++)
        free(ents[i].line);
    free(order);
    free(ents);
    cs_sym_cleanup();
    return rc;
}
