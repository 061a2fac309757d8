/* `capsan report`: one trace, read in one pass (reader.h): its stack
 * source and symbolizer, its max_findings and suppressions (the flag's,
 * or the run's own), the process's begin and end in each format around
 * the replay of its findings. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "report_int.h"
#include "options.h"
#include "html.h"
#include "json.h"
#include "reader.h"
#include "render.h"
#include "suppress.h"
#include "symbolize.h"

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

int report_one(entry *e, const entry *parent, report_ctx *c, FILE *errf)
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
    /* --strip-path-prefix, else the run's own */
    cs_render_strip_prefix(c->strip_flag ? c->strip_flag : t->opt_strip_prefix);

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
    static cs_frame_info crash[REPORT_CRASH_FRAMES];
    int ncrash = c->pi.ended == CS_END_SIGNAL ? report_crash_frames(c, crash, REPORT_CRASH_FRAMES)
                                              : 0;
    switch (c->format) {
    case FMT_JSON: {
        cs_json_proc jp = {
            .info = &c->pi, .argv = (const char *const *)t->argv, .argc = t->argc,
            .exe = t->exe, .trace = path, .error = t->error ? t->errmsg : NULL,
            .end_time_ns = t->has_end ? t->end.time_ns : 0, .parent_pid = parent_pid,
            .counts = t->counts, .ncounts = t->ncounts, .counts_records = t->counts_records,
            .counts_stride = t->counts_stride, .crash = crash, .ncrash = ncrash,
            .crash_tid = t->crash_tid,
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
            .end_function = c->pi.ended == CS_END_SIGNAL ? report_end_function(c) : NULL,
            .parent_pid = parent_pid, .depth = e->depth, .data_end = t->data_end,
            .truncated = !t->has_end, .counts = t->counts, .ncounts = t->ncounts,
            .counts_records = t->counts_records, .counts_stride = t->counts_stride,
            .crash = crash, .ncrash = ncrash,
        };
        cs_html_process_begin(c->html, &hp);
        break;
    }
    case FMT_TEXT:
        report_text_header(c, e, parent);
        break;
    }
    cs_trace_replay(t, report_on_finding, c);
    c->sum.events = cs_trace_events_observed(t);
    switch (c->format) {
    case FMT_JSON:
        cs_json_process_end(&c->json, &c->sum);
        break;
    case FMT_HTML:
        report_groups_render(c);
        cs_html_omitted(c->html, c->omitted, c->max);
        cs_html_process_end(c->html, &c->sum);
        break;
    case FMT_TEXT:
        report_groups_render(c);
        cs_render_text_omitted(c->out, 0, c->omitted, c->max);
        cs_supp_render_used(run_supp, c->out);
        cs_render_text_summary(c->out, &c->pi, &c->sum);
        cs_outf(c->out, "\n");
        break;
    }
    e->line = report_tree_line(c);
    cs_supp_free(run_supp);
    c->supp = NULL;
    int rc = t->error ? 1 : 0;
    cs_sym_destroy(c->sym);
    cs_trace_close(t);
    c->t = NULL;
    c->sym = NULL;
    return rc;
}
