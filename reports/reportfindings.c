/* `capsan report`: each finding of a process to its format, after the
 * suppressions: JSON as it comes, text and HTML at most max_findings
 * blocks with leaks grouped by kind and first stack (largest first), or
 * a suppression line (reportgensupp.c). */
#include <stdio.h>
#include <stdlib.h>

#include "report_int.h"
#include "html.h"
#include "json.h"
#include "leakgroups.h"
#include "render.h"
#include "suppress.h"

/* ---- leak groups ------------------------------------------------------------- */

static void group_add(report_ctx *c, const cs_finding *f)
{
    uint64_t where = f->nevents ? cs_stack_display_key(&c->src, f->events[0].stack) : 0;
    if (cs_lg_add(&c->groups, f, where) != 0) {
        fprintf(stderr, "capsan: out of memory\n");
        exit(1);
    }
}

void report_groups_render(report_ctx *c)
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

/* ---- findings ------------------------------------------------------------------- */

static int over_limit(report_ctx *c)
{
    return c->max && c->shown >= (unsigned long)c->max;
}

void report_on_finding(void *ud, const cs_finding *f)
{
    report_ctx *c = ud;
    if (c->supp && cs_supp_match(c->supp, f, &c->src)) {
        c->sum.suppressed++;
        return;
    }
    cs_summary_add(&c->sum, f);
    cs_summary_locate(&c->sum, f, &c->src);
    switch (c->format) {
    case FMT_JSON:
        cs_json_finding(&c->json, &c->pi, f, &c->src);
        break;
    case FMT_SUPP:
        report_gen_suppression(c, f);
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
