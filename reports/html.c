/* HTML report writer (html.h; html_int.h lists its files). This one owns
 * the page: a summary row and a section per process (how it ended, its
 * plot, the list the cards go in, its totals), then the page itself, the
 * staged body wrapped in the head, the summary table and the script.
 * Nothing is fetched: the CSP meta tag below forbids every load, so a page
 * that tried would show it as a console error (the Chromium test looks for
 * those). */
#include "html_int.h"
#include "signame.h"

#include <errno.h>
#include <signal.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

/* ---- small helpers ---------------------------------------------------------- */

static void *xmalloc(size_t n)
{
    void *p = malloc(n ? n : 1);
    if (!p) {
        fputs("capsan: out of memory\n", stderr);
        exit(1);
    }
    return p;
}

static char *xstrdup(const char *s)
{
    size_t n = strlen(s ? s : "");
    char *d = xmalloc(n + 1);
    memcpy(d, s ? s : "", n + 1);
    return d;
}

static char *xprintf(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static char *xprintf(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    char *s = xmalloc(n > 0 ? (size_t)n + 1 : 1);
    va_start(ap, fmt);
    vsnprintf(s, n > 0 ? (size_t)n + 1 : 1, fmt, ap);
    va_end(ap);
    return s;
}

static char *ended_text(const cs_html_proc *p)
{
    const cs_proc_info *pi = p->info;
    switch (pi->ended) {
    case CS_END_EXIT:
        return xprintf("exit %d", pi->status);
    case CS_END_HALT:
        return xprintf("halted on error, exit %d", pi->status);
    case CS_END_QUICK_EXIT:
        return xprintf("_exit %d (leaks judged by reachability)", pi->status);
    case CS_END_API_EXIT:
    case CS_END_STOPPED_EXIT: /* the status is -1 when capsan did not see it */
        return pi->status >= 0 ? xprintf("exit %d (%s)", pi->status, cs_end_unchecked_why(pi->ended))
                               : xprintf("exit (%s)", cs_end_unchecked_why(pi->ended));
    case CS_END_SIGNAL: {
        const char *name = cs_sig_abbrev(pi->status);
        char *pc = p->end_pc ? xprintf(" at pc 0x%llx%s%s", (unsigned long long)p->end_pc,
                                       p->end_function ? " in " : "",
                                       p->end_function ? p->end_function : "")
                             : xstrdup("");
        char *s = name ? xprintf("killed by signal %d (SIG%s)%s", pi->status, name, pc)
                       : xprintf("killed by signal %d%s", pi->status, pc);
        free(pc);
        return s;
    }
    default:
        if (pi->ended != CS_END_UNKNOWN) /* a newer writer's ending, or a damaged record */
            return xprintf("END record with ending %d, status %d", pi->ended, pi->status);
        return xprintf("no END record: killed (SIGKILL?) or still running; trace read up to "
                       "offset 0x%llx, no leak check", (unsigned long long)p->data_end);
    }
}

/* ---- begin / processes ------------------------------------------------------- */

cs_html *cs_html_begin(FILE *out, char *err, size_t errlen)
{
    cs_html *h = calloc(1, sizeof *h);
    if (!h) {
        snprintf(err, errlen, "out of memory");
        return NULL;
    }
    h->out = out;
    if (!(h->body = tmpfile())) {
        snprintf(err, errlen, "cannot create a temporary file for the HTML body: %s",
                 strerror(errno));
        free(h);
        return NULL;
    }
    return h;
}

static row *new_row(cs_html *h)
{
    if (h->nrows == h->cap) {
        h->cap = h->cap ? h->cap * 2 : 16;
        row *n = realloc(h->rows, h->cap * sizeof *n);
        if (!n) {
            fputs("capsan: out of memory\n", stderr);
            exit(1);
        }
        h->rows = n;
    }
    row *r = &h->rows[h->nrows++];
    memset(r, 0, sizeof *r);
    return r;
}

void cs_html_process_begin(cs_html *h, const cs_html_proc *p)
{
    const cs_proc_info *pi = p->info;
    row *r = new_row(h);
    r->pid = pi->pid;
    r->ppid = pi->ppid;
    r->parent_pid = p->parent_pid;
    r->depth = p->depth;
    size_t len = 0;
    for (unsigned i = 0; i < p->argc; i++)
        len += strlen(p->argv[i] ? p->argv[i] : "") + 1;
    r->argv = xmalloc(len + 1);
    r->argv[0] = 0;
    for (unsigned i = 0, at = 0; i < p->argc; i++) {
        const char *a = p->argv[i] ? p->argv[i] : "";
        size_t al = strlen(a);
        if (i)
            r->argv[at++] = ' ';
        memcpy(r->argv + at, a, al + 1);
        at += (unsigned)al;
    }
    r->ended = ended_text(p);
    r->ended_brief = pi->ended == CS_END_UNKNOWN ? "killed or still running (no END record)" : NULL;
    r->ended_class = pi->ended == CS_END_SIGNAL ? "signal" : pi->ended == CS_END_UNKNOWN ? "unknown" : "exit";
    r->trace = xstrdup(p->trace);
    r->error = p->error ? xstrdup(p->error) : NULL;

    h->cur = p;
    h->t_origin = pi->start_mono_ns;
    h->end_time = p->end_time_ns;
    size_t idx = h->nrows - 1;
    bodyf(h, "<section class=\"process\" id=\"p%zu\" data-pid=\"%llu\">\n<h2>Process %llu", idx,
          (unsigned long long)pi->pid, (unsigned long long)pi->pid);
    if (p->parent_pid) {
        size_t pidx = idx;
        for (size_t i = idx; i-- > 0;)
            if (h->rows[i].pid == p->parent_pid && !h->rows[i].unreadable) {
                pidx = i;
                break;
            }
        bodyf(h, " <small>child of <a href=\"#p%zu\">%llu</a></small>", pidx,
              (unsigned long long)p->parent_pid);
    }
    bodyf(h, "</h2>\n<dl class=\"meta\"><dt>command</dt><dd><code>");
    T(r->argv[0] ? r->argv : "(unknown)");
    bodyf(h, "</code></dd>");
    if (p->exe && *p->exe) {
        bodyf(h, "<dt>executable</dt><dd><code>");
        T(p->exe);
        bodyf(h, "</code></dd>");
    }
    bodyf(h, "<dt>parent</dt><dd>%llu</dd><dt>ended</dt><dd class=\"ended %s\">",
          (unsigned long long)pi->ppid, r->ended_class);
    T(r->ended);
    bodyf(h, "</dd>");
    if (p->end_time_ns && p->end_time_ns >= pi->start_mono_ns && pi->start_mono_ns) {
        char d[64];
        html_human_time(d, sizeof d, (double)(p->end_time_ns - pi->start_mono_ns));
        bodyf(h, "<dt>ran for</dt><dd>%s</dd>", d);
    }
    bodyf(h, "<dt>%s</dt><dd><code>", p->saved ? "pytest report" : "trace");
    T(p->trace);
    bodyf(h, "</code></dd></dl>\n");
    if (p->error) {
        bodyf(h, "<p class=\"readerror\">");
        T(p->error);
        bodyf(h, "</p>\n");
    }
    if (p->ncrash > 0)
        html_crash(h, p->crash, p->ncrash);
    if (!p->saved)
        html_plot(h, p);
    bodyf(h, "<div class=\"findings\">\n");
    h->nproc++;
}

void cs_html_process_end(cs_html *h, const cs_summary *s)
{
    row *r = h->nrows ? &h->rows[h->nrows - 1] : NULL;
    if (r)
        r->sum = *s;
    if (r && !r->cards && !s->errors && !s->warnings)
        bodyf(h, "<p class=\"clean\">No findings.</p>\n");
    char lb[64];
    html_human_bytes(lb, sizeof lb, s->leaked_bytes);
    char ib[96] = "";
    if (s->indirect_objects) {
        char hb[48];
        html_human_bytes(hb, sizeof hb, s->indirect_bytes);
        snprintf(ib, sizeof ib, " (and %s indirectly)", hb);
    }
    bodyf(h, "</div>\n<p class=\"psummary\">%u error(s), %u warning(s); %s leaked in %u object(s)%s; "
             "%llu event(s)%s</p>\n</section>\n",
          s->errors, s->warnings, lb, s->leak_objects, ib, (unsigned long long)s->events,
          s->suppressed ? "; some suppressed" : "");
    h->cur = NULL;
}

void cs_html_unreadable(cs_html *h, const char *path, const char *error)
{
    row *r = new_row(h);
    r->unreadable = 1;
    r->argv = xstrdup("");
    r->ended = xstrdup("unreadable");
    r->trace = xstrdup(path);
    r->error = xstrdup(error);
}

/* ---- the page ----------------------------------------------------------------- */

static void tree_prefix(FILE *out, const row *rows, size_t n, size_t i)
{
    /* "│  └─ " style guides from depth; ASCII-safe box drawing */
    int d = rows[i].depth;
    if (d <= 0)
        return;
    fputs("<span class=\"tree\">", out);
    for (int k = 1; k < d; k++)
        fputs("   ", out);
    /* last child of its parent when no later row at this depth before a shallower one */
    int last = 1;
    for (size_t j = i + 1; j < n; j++) {
        if (rows[j].depth < d)
            break;
        if (rows[j].depth == d) {
            last = 0;
            break;
        }
    }
    fputs(last ? "\xe2\x94\x94\xe2\x94\x80 " : "\xe2\x94\x9c\xe2\x94\x80 ", out);
    fputs("</span>", out);
}

int cs_html_end(cs_html *h)
{
    FILE *o = h->out;
    unsigned errors = 0, warnings = 0, leak_objects = 0, nproc = 0;
    uint64_t leaked = 0;
    for (size_t i = 0; i < h->nrows; i++) {
        errors += h->rows[i].sum.errors;
        warnings += h->rows[i].sum.warnings;
        leaked += h->rows[i].sum.leaked_bytes;
        leak_objects += h->rows[i].sum.leak_objects;
        nproc += !h->rows[i].unreadable;
    }
    char lb[64];
    html_human_bytes(lb, sizeof lb, leaked);
    fprintf(o, "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\n"
               "<meta http-equiv=\"Content-Security-Policy\" content=\"default-src 'none'; "
               "style-src 'unsafe-inline'; script-src 'unsafe-inline'; img-src data:\">\n"
               "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n"
               "<title>capsan report: %u error(s), %u warning(s)</title>\n<style>%s</style>\n"
               "<script>%s</script>\n</head>\n<body data-cards=\"%u\">\n",
            errors, warnings, html_css, html_head_script, h->cards);
    fprintf(o, "<header class=\"top\"><h1>capsan report</h1><p>%u process(es), %u error(s), "
               "%u warning(s), %s leaked in %u object(s)</p></header>\n<main>\n",
            nproc, errors, warnings, lb, leak_objects);
    fprintf(o, "<h2>Processes</h2>\n<table class=\"summary\"><thead><tr><th>pid</th><th>ppid</th>"
               "<th>command</th><th>ended</th><th>errors</th><th>warnings</th><th>leaked</th>"
               "<th>events</th><th>trace</th></tr></thead><tbody>\n");
    for (size_t i = 0; i < h->nrows; i++) {
        const row *r = &h->rows[i];
        int bad = r->unreadable || r->error || r->sum.errors;
        fprintf(o, "<tr%s><td>", bad ? " class=\"bad\"" : "");
        tree_prefix(o, h->rows, h->nrows, i);
        if (r->unreadable)
            fputs("?", o);
        else
            fprintf(o, "<a href=\"#p%zu\">%llu</a>", i, (unsigned long long)r->pid);
        fprintf(o, "</td><td class=\"num\">%llu</td><td class=\"argv\"><code>",
                (unsigned long long)r->ppid);
        cs_html_text(o, r->argv);
        fprintf(o, "</code></td><td class=\"ended %s\">", r->unreadable ? "unknown" : r->ended_class);
        cs_html_text(o, r->ended_brief ? r->ended_brief : r->ended);
        html_human_bytes(lb, sizeof lb, r->sum.leaked_bytes);
        fprintf(o, "</td><td class=\"num\">%u</td><td class=\"num\">%u</td><td class=\"num\">%s</td>"
                   "<td class=\"num\">%llu</td><td><code>",
                r->sum.errors, r->sum.warnings, lb, (unsigned long long)r->sum.events);
        cs_html_text(o, r->trace);
        fputs("</code>", o);
        if (r->error) {
            fputs("<br><span class=\"readerror\">", o);
            cs_html_text(o, r->error);
            fputs("</span>", o);
        }
        fputs("</td></tr>\n", o);
    }
    fputs("</tbody></table>\n<div class=\"controls\"><button type=\"button\" id=\"expand-all\">"
          "expand all stacks</button><button type=\"button\" id=\"collapse-all\">collapse all"
          "</button>", o);
    for (int k = 1; k < CS_KIND_COUNT; k++) {
        if (!h->per_kind[k])
            continue;
        fprintf(o, "<label><input type=\"checkbox\" class=\"kind-filter\" value=\"%s\" checked> "
                   "%s (%u)</label>", cs_kind_name(k), cs_kind_name(k), h->per_kind[k]);
    }
    fputs("</div>\n", o);

    /* the body staged so far */
    int rc = 0;
    if (fflush(h->body) != 0 || fseek(h->body, 0, SEEK_SET) != 0)
        rc = -1;
    char buf[1 << 16];
    size_t n;
    while (!rc && (n = fread(buf, 1, sizeof buf, h->body)) > 0)
        if (fwrite(buf, 1, n, o) != n)
            rc = -1;
    if (ferror(h->body))
        rc = -1;
    fprintf(o, "</main>\n<div id=\"selfcheck\" hidden data-ok=\"\">self-check did not run (JavaScript off)"
               "</div>\n<script>%s</script>\n</body></html>\n", html_script);

    fclose(h->body);
    for (size_t i = 0; i < h->nrows; i++) {
        free(h->rows[i].argv);
        free(h->rows[i].ended);
        free(h->rows[i].trace);
        free(h->rows[i].error);
    }
    free(h->rows);
    free(h);
    return rc;
}
