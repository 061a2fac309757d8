/* `capsan report`: one pytest report (savedreport.h) rendered as a trace
 * is, one process, its findings under the test they came from, with
 * JSON's "test" and "allowed" on each finding. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "report_int.h"
#include "options.h"
#include "html.h"
#include "json.h"
#include "render.h"
#include "savedreport.h"

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
    cs_out o = {.write = report_mem_write, .ud = &m};
    cs_outf(&o, "%llu ", (unsigned long long)c->pi.pid);
    report_out_args(&o, s->argv, s->argc, s->argc > 0, 100);
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
int report_saved(entry *e, report_ctx *c, FILE *errf)
{
    char err[700];
    cs_saved *s = cs_saved_open(e->path, err, sizeof err);
    e->done = 1;
    cs_render_strip_prefix(c->strip_flag);
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
        report_out_args(o, s->argv, s->argc, s->argc > 0, 4096);
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
            cs_out mo = {.write = report_mem_write, .ud = &m};
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
            report_on_finding(c, &s->findings[i]);
        }
        if (c->format == FMT_TEXT || c->format == FMT_HTML)
            report_groups_render(c);
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
