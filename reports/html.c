/* HTML report writer (html.h). One page, nothing fetched: the CSP meta tag
 * below forbids every load, so a page that tried would show it as a
 * console error (the Chromium test looks for those). Plots and timelines
 * are SVG written here, so the page reads without JavaScript too. */
#include "html.h"
#include "leakgroups.h"
#include "utf8.h"

#include <errno.h>
#include <signal.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#define HTML_MAX_FRAMES 128
/* plot geometry (SVG user units) */
#define PW 820.0
#define PH 260.0
#define PL 78.0               /* left margin: byte axis labels */
#define PR 62.0               /* right margin: tensor axis labels */
#define PT 16.0
#define PB 40.0
/* timeline geometry */
#define TW 820.0
#define TLABEL 330.0          /* label column */
#define TROW 22.0
#define TTOP 20.0

typedef struct row {
    uint64_t pid, ppid, parent_pid;
    int depth;
    char *argv;               /* joined, raw bytes: escaped when written */
    char *ended;              /* in the process's section */
    const char *ended_brief;  /* in the summary table, or NULL: ended */
    const char *ended_class;  /* exit, signal, unknown */
    char *trace;
    char *error;
    cs_summary sum;
    int unreadable;
    unsigned cards;
} row;

struct cs_html {
    FILE *out, *body;
    row *rows;
    size_t nrows, cap;
    unsigned cards;           /* finding cards written */
    unsigned nproc;
    const cs_html_proc *cur;  /* the process being written */
    uint64_t t_origin;        /* its start (CLOCK_MONOTONIC) */
    uint64_t end_time;
    unsigned per_kind[CS_KIND_COUNT];
};

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


void cs_html_text(FILE *out, const char *str)
{
    if (!str)
        return;
    const unsigned char *s = (const unsigned char *)str;
    size_t left = strlen(str);
    while (left) {
        unsigned c = *s;
        size_t n = 1;
        switch (c) {
        case '&': fputs("&amp;", out); break;
        case '<': fputs("&lt;", out); break;
        case '>': fputs("&gt;", out); break;
        case '"': fputs("&quot;", out); break;
        case '\'': fputs("&#39;", out); break;
        default:
            if (c < 0x20 || c == 0x7f) {
                /* visible, and never a parse error */
                fprintf(out, "\\x%02x", c);
            } else if ((n = cs_utf8_len(s, left)) == 0) {
                fputs("\xef\xbf\xbd", out);  /* U+FFFD */
                n = 1;
            } else {
                fwrite(s, 1, n, out);
            }
        }
        s += n;
        left -= n;
    }
}

#define T(s) cs_html_text(h->body, s)

static void bodyf(cs_html *h, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void bodyf(cs_html *h, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vfprintf(h->body, fmt, ap);
    va_end(ap);
}

static const char *base_name(const char *path)
{
    const char *s = path ? strrchr(path, '/') : NULL;
    return s ? s + 1 : path;
}

/* a double: an axis label may lie beyond UINT64_MAX (a plot's top is the
 * largest value rounded up, and converting that back was undefined) */
static void human_bytes(char *buf, size_t n, double b)
{
    if (b < 1024)
        snprintf(buf, n, "%.0f B", b);
    else if (b < 1024ull * 1024)
        snprintf(buf, n, "%.1f KiB", b / 1024.0);
    else if (b < 1024ull * 1024 * 1024)
        snprintf(buf, n, "%.1f MiB", b / (1024.0 * 1024));
    else
        snprintf(buf, n, "%.2f GiB", b / (1024.0 * 1024 * 1024));
}

static void human_time(char *buf, size_t n, double ns)
{
    if (ns < 0)
        ns = 0;
    if (ns < 1e3)
        snprintf(buf, n, "%.0f ns", ns);
    else if (ns < 1e6)
        snprintf(buf, n, "%.3g µs", ns / 1e3);
    else if (ns < 1e9)
        snprintf(buf, n, "%.4g ms", ns / 1e6);
    else
        snprintf(buf, n, "%.4g s", ns / 1e9);
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
        const char *name = sigabbrev_np(pi->status);
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

static double nice_ceil(double v)
{
    if (v <= 0)
        return 1;
    double p = 1;
    while (p * 10 <= v)
        p *= 10;
    while (p > v)
        p /= 10;
    static const double steps[] = {1, 2, 2.5, 5, 10};
    for (int i = 0; i < 5; i++)
        if (steps[i] * p >= v)
            return steps[i] * p;
    return 10 * p;
}

static void plot(cs_html *h, const cs_html_proc *p)
{
    size_t n = p->ncounts;
    bodyf(h, "<figure class=\"plotbox\"><figcaption>Live NumPy data bytes and live DLPack tensors "
             "over time</figcaption>\n");
    if (!n) {
        bodyf(h, "<p class=\"note\">No COUNTS records in this trace: the plot needs a runtime that "
                 "writes them (every 10 ms while events happen, and at the end).</p></figure>\n");
        return;
    }
    uint64_t origin = h->t_origin;
    if (!origin || p->counts[0].time_ns < origin)
        origin = p->counts[0].time_ns;
    double tmax = 0, npmax = 0, dlmax = 0;
    for (size_t i = 0; i < n; i++) {
        double t = (double)(p->counts[i].time_ns - origin);
        if (t > tmax)
            tmax = t;
        if ((double)p->counts[i].live_numpy_bytes > npmax)
            npmax = (double)p->counts[i].live_numpy_bytes;
        if ((double)p->counts[i].live_dlpack > dlmax)
            dlmax = (double)p->counts[i].live_dlpack;
    }
    if (p->end_time_ns > origin && (double)(p->end_time_ns - origin) > tmax)
        tmax = (double)(p->end_time_ns - origin);
    if (tmax <= 0)
        tmax = 1e6;
    /* at least 0..4 on each axis, so that the ticks differ */
    npmax = nice_ceil(npmax < 4 ? 4 : npmax);
    dlmax = nice_ceil(dlmax < 4 ? 4 : dlmax);
    const double w = PW - PL - PR, ht = PH - PT - PB;
#define X(t) (PL + (t) / tmax * w)
#define YNP(v) (PT + ht - (v) / npmax * ht)
#define YDL(v) (PT + ht - (v) / dlmax * ht)

    bodyf(h, "<svg class=\"plot\" viewBox=\"0 0 %.0f %.0f\" role=\"img\" aria-label=\"live memory "
             "plot\" data-n=\"%zu\" data-l=\"%.1f\" data-w=\"%.1f\" data-tmax=\"%.0f\" data-t=\"",
          PW, PH, n, PL, w, tmax);
    for (size_t i = 0; i < n; i++)
        bodyf(h, "%s%llu", i ? "," : "", (unsigned long long)(p->counts[i].time_ns - origin));
    bodyf(h, "\" data-np=\"");
    for (size_t i = 0; i < n; i++)
        bodyf(h, "%s%llu", i ? "," : "", (unsigned long long)p->counts[i].live_numpy_bytes);
    bodyf(h, "\" data-dl=\"");
    for (size_t i = 0; i < n; i++)
        bodyf(h, "%s%llu", i ? "," : "", (unsigned long long)p->counts[i].live_dlpack);
    bodyf(h, "\">\n");
    /* grid and axes */
    char lab[64];
    for (int k = 0; k <= 4; k++) {
        double y = PT + ht - ht * k / 4;
        bodyf(h, "<line class=\"grid\" x1=\"%.1f\" x2=\"%.1f\" y1=\"%.1f\" y2=\"%.1f\"/>", PL,
              PL + w, y, y);
        human_bytes(lab, sizeof lab, npmax * k / 4);
        bodyf(h, "<text class=\"ax np\" x=\"%.1f\" y=\"%.1f\" text-anchor=\"end\">%s</text>",
              PL - 6, y + 4, lab);
        bodyf(h, "<text class=\"ax dl\" x=\"%.1f\" y=\"%.1f\">%g</text>\n", PL + w + 6, y + 4,
              dlmax * k / 4);
    }
    for (int k = 0; k <= 5; k++) {
        double x = PL + w * k / 5;
        human_time(lab, sizeof lab, tmax * k / 5);
        bodyf(h, "<text class=\"ax\" x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\">%s</text>", x,
              PT + ht + 16, lab);
    }
    bodyf(h, "<text class=\"ax\" x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\">time since the "
             "process started</text>\n", PL + w / 2, PH - 4);
    bodyf(h, "<line class=\"axis\" x1=\"%.1f\" x2=\"%.1f\" y1=\"%.1f\" y2=\"%.1f\"/>\n", PL, PL + w,
          PT + ht, PT + ht);
    /* the series */
    bodyf(h, "<polyline class=\"series np\" data-n=\"%zu\" points=\"", n);
    for (size_t i = 0; i < n; i++)
        bodyf(h, "%s%.1f,%.1f", i ? " " : "", X((double)(p->counts[i].time_ns - origin)),
              YNP((double)p->counts[i].live_numpy_bytes));
    bodyf(h, "\"/>\n<polyline class=\"series dl\" data-n=\"%zu\" points=\"", n);
    for (size_t i = 0; i < n; i++)
        bodyf(h, "%s%.1f,%.1f", i ? " " : "", X((double)(p->counts[i].time_ns - origin)),
              YDL((double)p->counts[i].live_dlpack));
    bodyf(h, "\"/>\n<line class=\"cursor\" x1=\"-10\" x2=\"-10\" y1=\"%.1f\" y2=\"%.1f\"/>"
             "<text class=\"readout\" x=\"%.1f\" y=\"%.1f\"></text>\n</svg>\n",
          PT, PT + ht, PL + 8, PT + 12);
#undef X
#undef YNP
#undef YDL
    bodyf(h, "<p class=\"legend\"><span class=\"key np\"></span>live NumPy data bytes (left axis) "
             "<span class=\"key dl\"></span>live DLPack tensors (right axis) &middot; %zu point(s)",
          n);
    if (p->counts_stride > 1)
        bodyf(h, ", downsampled from %llu COUNTS records: each point is the maximum of %llu "
                 "consecutive records", (unsigned long long)p->counts_records,
              (unsigned long long)p->counts_stride);
    bodyf(h, "</p></figure>\n");
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
        human_time(d, sizeof d, (double)(p->end_time_ns - pi->start_mono_ns));
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
    if (!p->saved)
        plot(h, p);
    bodyf(h, "<div class=\"findings\">\n");
    h->nproc++;
}

/* the thread-independent part of the phrase: "exported at" -> "exported" */
static void phrase_short(char *buf, size_t n, const char *phrase)
{
    snprintf(buf, n, "%s", phrase ? phrase : "event");
    size_t l = strlen(buf);
    if (l > 3 && strcmp(buf + l - 3, " at") == 0)
        buf[l - 3] = 0;
}

static double rel_ns(const cs_html *h, uint64_t t)
{
    return h->t_origin && t >= h->t_origin ? (double)(t - h->t_origin) : (double)t;
}

static void timeline(cs_html *h, const cs_finding *f, int nev)
{
    int leak = cs_kind_is_leak(f->kind);
    int exit_row = leak && h->end_time && nev && h->end_time >= f->events[nev - 1].time_ns;
    int rows = nev + exit_row;
    if (!rows)
        return;
    uint64_t t0 = f->events[0].time_ns, t1 = t0;
    for (int i = 0; i < nev; i++) {
        if (f->events[i].time_ns < t0)
            t0 = f->events[i].time_ns;
        if (f->events[i].time_ns > t1)
            t1 = f->events[i].time_ns;
    }
    if (exit_row && h->end_time > t1)
        t1 = h->end_time;
    double span = (double)(t1 - t0);
    const double x0 = TLABEL + 10, xw = TW - x0 - 20;
    double height = TTOP + rows * TROW + 8;
    char a[64], b[64], d[64];
    human_time(a, sizeof a, rel_ns(h, t0));
    human_time(b, sizeof b, rel_ns(h, t1));
    human_time(d, sizeof d, span);
    bodyf(h, "<svg class=\"timeline\" viewBox=\"0 0 %.0f %.0f\" role=\"img\" aria-label=\"lifecycle "
             "timeline\" data-events=\"%d\">\n", TW, height, nev);
    bodyf(h, "<text class=\"ax\" x=\"%.1f\" y=\"12\">+%s</text><text class=\"ax\" x=\"%.1f\" y=\"12\" "
             "text-anchor=\"end\">+%s</text><text class=\"ax\" x=\"%.1f\" y=\"12\" "
             "text-anchor=\"middle\">object lifecycle, %s</text>\n",
          x0, a, x0 + xw, b, x0 + xw / 2, d);
    double px = 0, py = 0;
    for (int i = 0; i < rows; i++) {
        double y = TTOP + i * TROW + TROW / 2;
        uint64_t t = i < nev ? f->events[i].time_ns : h->end_time;
        double x = span > 0 ? x0 + (double)(t - t0) / span * xw : x0 + xw / 2;
        char ph[96], tt[64];
        if (i < nev)
            phrase_short(ph, sizeof ph, cs_event_phrase(f, i));
        else
            snprintf(ph, sizeof ph, "process exit: never released");
        human_time(tt, sizeof tt, rel_ns(h, t));
        bodyf(h, "<line class=\"row\" x1=\"%.1f\" x2=\"%.1f\" y1=\"%.1f\" y2=\"%.1f\"/>", x0,
              x0 + xw, y, y);
        bodyf(h, "<text class=\"lab\" x=\"4\" y=\"%.1f\">", y + 4);
        T(ph);
        if (i < nev)
            bodyf(h, " (T%u)", f->events[i].thread);
        bodyf(h, " +%s</text>", tt);
        if (i)
            bodyf(h, "<line class=\"step\" x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\"/>", px, py,
                  x, y);
        bodyf(h, "<circle class=\"ev%s\" cx=\"%.1f\" cy=\"%.1f\" r=\"5\"><title>", i < nev ? "" : " exit",
              x, y);
        T(ph);
        bodyf(h, " at +%s", tt);
        if (i < nev)
            bodyf(h, ", thread T%u", f->events[i].thread);
        bodyf(h, "</title></circle>\n");
        px = x;
        py = y;
    }
    bodyf(h, "</svg>\n");
}

static void frame_html(cs_html *h, const cs_frame_info *fr)
{
    if (fr->python) {
        bodyf(h, "<li class=\"fr py\"><span class=\"lang\">py</span> <span class=\"loc\">");
        T(fr->file ? fr->file : "<unknown>");
        if (fr->line)
            bodyf(h, ":%u", fr->line);
        bodyf(h, "</span> in <span class=\"fn\">");
        T(fr->function ? fr->function : "<unknown>");
        bodyf(h, "</span></li>\n");
        return;
    }
    bodyf(h, "<li class=\"fr native%s\"><span class=\"lang\">c</span> <code class=\"addr\">0x%llx</code>",
          fr->inlined ? " inlined" : "", (unsigned long long)fr->address);
    if (fr->function) {
        bodyf(h, " in <span class=\"fn\">");
        T(fr->function);
        bodyf(h, "</span>");
    }
    if (fr->file) {
        bodyf(h, " <span class=\"loc\">");
        T(fr->file);
        if (fr->line)
            bodyf(h, ":%u", fr->line);
        bodyf(h, "</span>");
    }
    if (fr->module) {
        bodyf(h, " <span class=\"mod\" title=\"");
        T(fr->module);
        if (fr->build_id) {
            bodyf(h, " BuildId: ");
            T(fr->build_id);
        }
        bodyf(h, "\">(");
        T(base_name(fr->module));
        bodyf(h, "+0x%llx)</span>", (unsigned long long)fr->offset);
    } else if (!fr->function) {
        bodyf(h, " <span class=\"mod\">(unknown module)</span>");
    }
    if (fr->inlined)
        bodyf(h, " <span class=\"tag\">inlined</span>");
    bodyf(h, "</li>\n");
}

static void event_html(cs_html *h, const char *phrase, const cs_event *ev, int open,
                       const cs_stack_source *src)
{
    char tt[64];
    human_time(tt, sizeof tt, rel_ns(h, ev->time_ns));
    bodyf(h, "<details class=\"event\"%s><summary><b>", open ? " open" : "");
    T(phrase);
    bodyf(h, "</b> thread T%u, +%s</summary>\n<ol class=\"stack\" start=\"0\">\n", ev->thread, tt);
    cs_frame_info frames[HTML_MAX_FRAMES];
    int n = src ? cs_stack_frames(src, ev->stack, frames, HTML_MAX_FRAMES) : 0;
    if (!n)
        bodyf(h, "<li class=\"fr none\">no stack recorded</li>\n");
    for (int k = 0; k < n; k++)
        frame_html(h, &frames[k]);
    bodyf(h, "</ol></details>\n");
}

/* One card: a finding, or (count > 1) a group of identical leaks with the
 * oldest of them as the example and the totals of all */
static void card(cs_html *h, const cs_finding *f, const cs_stack_source *src, unsigned count,
                 uint64_t total, unsigned ind_count, uint64_t ind_bytes)
{
    char msg[512], bytes[64];
    int warn = cs_finding_severity(f) == CS_SEV_WARNING;
    const char *kind = cs_kind_name(f->kind);
    int nev = f->nevents < CS_FINDING_MAX_EVENTS ? f->nevents : CS_FINDING_MAX_EVENTS;
    h->cards++;
    if (f->kind < CS_KIND_COUNT)
        h->per_kind[f->kind] += count;
    if (h->nrows)
        h->rows[h->nrows - 1].cards++;
    bodyf(h, "<article class=\"finding %s\" id=\"f%u\" data-kind=\"", warn ? "warning" : "error",
          h->cards);
    T(kind);
    bodyf(h, "\">\n<header><span class=\"badge\">%s</span> <span class=\"kind\">",
          warn ? "warning" : "error");
    T(kind);
    bodyf(h, "</span> <span class=\"obj\">");
    T(cs_finding_object_type(f));
    bodyf(h, " <code>0x%llx</code></span>", (unsigned long long)f->obj);
    if (total) {
        human_bytes(bytes, sizeof bytes, (double)total);
        bodyf(h, " <span class=\"bytes\" title=\"%llu bytes\">%s</span>",
              (unsigned long long)total, bytes);
    }
    bodyf(h, "</header>\n");
    if (count > 1)
        bodyf(h, "<p class=\"group\">%u objects made at the same stack, %llu bytes in all; "
                 "the first of them:</p>\n", count, (unsigned long long)total);
    bodyf(h, "<p class=\"msg\">");
    T(cs_finding_message(f, msg, sizeof msg));
    bodyf(h, "</p>\n");
    timeline(h, f, nev);
    bodyf(h, "<div class=\"events\">\n");
    for (int i = 0; i < nev; i++) {
        const char *phrase = cs_event_phrase(f, i);
        /* the last event is the one that made the finding: open it */
        event_html(h, phrase ? phrase : cs_event_name(&f->events[i]), &f->events[i], i == nev - 1,
                   src);
    }
    if (ind_count) {
        /* what only this leak keeps alive, grouped under it */
        human_bytes(bytes, sizeof bytes, (double)ind_bytes);
        bodyf(h, "<p class=\"indirect\">Indirect leak of %s in %u object(s), kept alive by this "
                 "leak; the first allocated at:</p>\n", bytes, ind_count);
        if (f->nindirect)
            event_html(h, "allocated at", &f->indirect[0].alloc, 0, src);
    }
    bodyf(h, "</div></article>\n");
}

void cs_html_finding(cs_html *h, const cs_finding *f, const cs_stack_source *src)
{
    card(h, f, src, 1, f->bytes, f->nindirect, f->indirect_bytes);
}

void cs_html_leak_group(cs_html *h, const cs_leak_group *g, const cs_stack_source *src)
{
    card(h, &g->first, src, g->count, g->bytes, g->ind_count, g->ind_bytes);
}

void cs_html_heading(cs_html *h, const char *text)
{
    bodyf(h, "<h3 class=\"test\">");
    T(text);
    bodyf(h, "</h3>\n");
}

void cs_html_omitted(cs_html *h, unsigned n, long max_findings)
{
    if (n)
        bodyf(h, "<p class=\"omitted\">Omitting %u more finding(s) (max_findings=%ld; "
                 "<code>capsan report --max-findings 0</code> shows all).</p>\n", n, max_findings);
}

void cs_html_process_end(cs_html *h, const cs_summary *s)
{
    row *r = h->nrows ? &h->rows[h->nrows - 1] : NULL;
    if (r)
        r->sum = *s;
    if (r && !r->cards && !s->errors && !s->warnings)
        bodyf(h, "<p class=\"clean\">No findings.</p>\n");
    char lb[64];
    human_bytes(lb, sizeof lb, s->leaked_bytes);
    char ib[96] = "";
    if (s->indirect_objects) {
        char hb[48];
        human_bytes(hb, sizeof hb, s->indirect_bytes);
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

static const char css[] =
    "*{box-sizing:border-box}"
    "body{font:14px/1.45 system-ui,-apple-system,'Segoe UI',Roboto,sans-serif;margin:0;"
    "color:#1d2430;background:#f4f6f9}"
    "header.top{background:#1d2430;color:#fff;padding:14px 24px}"
    "header.top h1{margin:0;font-size:20px}header.top p{margin:4px 0 0;color:#c9d1dc}"
    "main{padding:8px 24px 40px;max-width:1200px}"
    "h2{font-size:17px;margin:22px 0 8px}h2 small{font-weight:normal;color:#555}"
    "h3.test{font-size:14px;margin:16px 0 6px;font-family:monospace}"
    "table.summary{border-collapse:collapse;background:#fff;width:100%;font-size:13px}"
    ".summary th,.summary td{border:1px solid #d5dbe3;padding:4px 8px;text-align:left;"
    "vertical-align:top}"
    ".summary th{background:#e8ecf2}.summary td.num{text-align:right;font-variant-numeric:tabular-nums}"
    ".summary td.argv{min-width:240px}.summary td.argv code{word-break:break-all}.summary td.ended.signal,.summary td.ended.unknown{color:#b00020;font-weight:600}"
    ".tree{color:#8a94a3;white-space:pre;font-family:monospace}"
    "code{font:12px/1.4 ui-monospace,SFMono-Regular,Menlo,Consolas,monospace}"
    ".controls{margin:12px 0;display:flex;gap:12px;flex-wrap:wrap;align-items:center}"
    ".controls button{font:inherit;padding:2px 10px}"
    "section.process{background:#fff;border:1px solid #d5dbe3;border-radius:6px;padding:4px 16px 12px;"
    "margin:18px 0}"
    "dl.meta{display:grid;grid-template-columns:max-content 1fr;gap:2px 12px;margin:6px 0}"
    "dl.meta dt{color:#5b6573}dl.meta dd{margin:0;word-break:break-all}"
    ".ended.signal,.ended.unknown{color:#b00020;font-weight:600}"
    ".readerror{color:#b00020;font-weight:600}"
    "figure.plotbox{margin:10px 0}figcaption{font-weight:600;margin-bottom:4px}"
    "svg.plot{width:100%;max-width:820px;height:auto;background:#fbfcfe;border:1px solid #e1e6ed}"
    "svg .grid{stroke:#e6eaf0}svg .axis{stroke:#9aa4b1}"
    "svg text{font:11px system-ui,sans-serif;fill:#5b6573}"
    "svg .series{fill:none;stroke-width:1.6}svg .series.np{stroke:#1f6feb}"
    "svg .series.dl{stroke:#d9480f}svg .ax.np{fill:#1f6feb}svg .ax.dl{fill:#d9480f}"
    "svg .cursor{stroke:#444;stroke-dasharray:3 3}svg .readout{fill:#1d2430;font-weight:600}"
    ".legend{font-size:12px;color:#5b6573;margin:2px 0}"
    ".key{display:inline-block;width:14px;height:3px;margin:0 4px 3px 8px;vertical-align:middle}"
    ".key.np{background:#1f6feb}.key.dl{background:#d9480f}"
    "article.finding{border:1px solid #d5dbe3;border-left:5px solid #b00020;border-radius:4px;"
    "padding:6px 12px;margin:12px 0;background:#fff}"
    "article.finding.warning{border-left-color:#8e44ad}"
    "article.finding header{display:flex;gap:8px;align-items:baseline;flex-wrap:wrap}"
    ".badge{font-size:11px;text-transform:uppercase;color:#fff;background:#b00020;padding:1px 6px;"
    "border-radius:3px}.warning .badge{background:#8e44ad}"
    ".kind{font-weight:700}.obj{color:#5b6573}.bytes{color:#5b6573}"
    ".msg{margin:6px 0}"
    "svg.timeline{width:100%;max-width:820px;height:auto;display:block;margin:4px 0}"
    "svg.timeline .row{stroke:#eef1f5}svg.timeline .step{stroke:#9aa4b1}"
    "svg.timeline circle{fill:#1f6feb}svg.timeline circle.exit{fill:#b00020}"
    "svg.timeline .lab{fill:#1d2430;font-size:12px}"
    "details.event{margin:2px 0}details.event summary{cursor:pointer}"
    "ol.stack{margin:2px 0 6px;padding-left:44px;font:12px/1.5 ui-monospace,Menlo,Consolas,monospace}"
    "ol.stack li{word-break:break-all}"
    ".lang{display:inline-block;width:18px;font-size:10px;color:#fff;background:#1f6feb;"
    "text-align:center;border-radius:2px}.native .lang{background:#6b7785}"
    ".fn{font-weight:600}.mod{color:#6b7785}.tag{font-size:10px;color:#6b7785}"
    ".py .loc{color:#0b6e4f}"
    ".omitted,.note,.clean{color:#5b6573;font-style:italic}.psummary{color:#1d2430;font-weight:600}"
    "#selfcheck{margin:20px 24px;color:#5b6573;font-size:12px}"
    "#selfcheck.failed{color:#b00020}";

static const char head_script[] =
    "window.__capsanErrors=[];"
    "window.addEventListener('error',function(e){window.__capsanErrors.push(String(e.message))});";

static const char script[] =
    "(function(){'use strict';\n"
    "var errors=window.__capsanErrors||[];\n"
    "function all(sel,root){return Array.prototype.slice.call((root||document).querySelectorAll(sel));}\n"
    "function setOpen(v){all('details.event').forEach(function(d){d.open=v;});}\n"
    "var ex=document.getElementById('expand-all'),co=document.getElementById('collapse-all');\n"
    "if(ex)ex.addEventListener('click',function(){setOpen(true);});\n"
    "if(co)co.addEventListener('click',function(){setOpen(false);});\n"
    "all('input.kind-filter').forEach(function(cb){cb.addEventListener('change',function(){\n"
    "  all('article.finding').forEach(function(a){if(a.getAttribute('data-kind')===cb.value)a.hidden=!cb.checked;});});});\n"
    "function nums(svg,name){var s=svg.getAttribute(name)||'';return s?s.split(',').map(Number):[];}\n"
    "function hbytes(b){var u=['B','KiB','MiB','GiB'],i=0;while(b>=1024&&i<3){b/=1024;i++;}return (i?b.toFixed(1):b)+' '+u[i];}\n"
    "function htime(ns){return ns<1e6?(ns/1e3).toFixed(1)+' \\u00b5s':ns<1e9?(ns/1e6).toFixed(2)+' ms':(ns/1e9).toFixed(3)+' s';}\n"
    "all('svg.plot').forEach(function(svg){\n"
    "  var t=nums(svg,'data-t'),np=nums(svg,'data-np'),dl=nums(svg,'data-dl');\n"
    "  var l=+svg.getAttribute('data-l'),w=+svg.getAttribute('data-w'),tmax=+svg.getAttribute('data-tmax');\n"
    "  var cur=svg.querySelector('.cursor'),ro=svg.querySelector('.readout');\n"
    "  if(!t.length||!cur||!ro)return;\n"
    "  svg.addEventListener('mousemove',function(e){\n"
    "    var m=svg.getScreenCTM();if(!m)return;\n"
    "    var p=svg.createSVGPoint();p.x=e.clientX;p.y=e.clientY;p=p.matrixTransform(m.inverse());\n"
    "    var want=(p.x-l)/w*tmax,lo=0,hi=t.length-1;\n"
    "    while(lo<hi){var mid=(lo+hi)>>1;if(t[mid]<want)lo=mid+1;else hi=mid;}\n"
    "    if(lo>0&&Math.abs(t[lo-1]-want)<Math.abs(t[lo]-want))lo--;\n"
    "    var x=l+t[lo]/tmax*w;cur.setAttribute('x1',x);cur.setAttribute('x2',x);\n"
    "    ro.textContent='+'+htime(t[lo])+': '+hbytes(np[lo])+' NumPy data, '+dl[lo]+' DLPack tensor(s)';});\n"
    "  svg.addEventListener('mouseleave',function(){cur.setAttribute('x1',-10);cur.setAttribute('x2',-10);ro.textContent='';});\n"
    "});\n"
    "var sc=document.getElementById('selfcheck');\n"
    "try{\n"
    "  var cards=all('article.finding').length,plots=all('svg.plot'),points=0,dlpoints=0,mismatch=0;\n"
    "  plots.forEach(function(svg){all('polyline.series',svg).forEach(function(pl){\n"
    "    var n=pl.points.numberOfItems;if(n!==+pl.getAttribute('data-n'))mismatch++;\n"
    "    if(pl.classList.contains('np'))points+=n;else dlpoints+=n;});});\n"
    "  var timelines=all('svg.timeline').length,expected=+document.body.getAttribute('data-cards');\n"
    "  var ok=!errors.length&&!mismatch&&cards===expected&&points===dlpoints;\n"
    "  sc.setAttribute('data-cards',cards);sc.setAttribute('data-plots',plots.length);\n"
    "  sc.setAttribute('data-points',points);sc.setAttribute('data-timelines',timelines);\n"
    "  sc.setAttribute('data-mismatch',mismatch);sc.setAttribute('data-errors',errors.length);\n"
    "  sc.setAttribute('data-ok',ok?'1':'0');sc.className=ok?'ok':'failed';\n"
    "  sc.textContent='self-check '+(ok?'ok':'FAILED')+': '+cards+' finding card(s), '+timelines+' timeline(s), '+\n"
    "    plots.length+' plot(s) with '+points+' point(s) per series, '+errors.length+' script error(s)'+\n"
    "    (errors.length?': '+errors.join('; '):'');\n"
    "}catch(e){sc.setAttribute('data-ok','0');sc.className='failed';sc.textContent='self-check FAILED: '+e;}\n"
    "})();\n";

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
    human_bytes(lb, sizeof lb, leaked);
    fprintf(o, "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\n"
               "<meta http-equiv=\"Content-Security-Policy\" content=\"default-src 'none'; "
               "style-src 'unsafe-inline'; script-src 'unsafe-inline'; img-src data:\">\n"
               "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n"
               "<title>capsan report: %u error(s), %u warning(s)</title>\n<style>%s</style>\n"
               "<script>%s</script>\n</head>\n<body data-cards=\"%u\">\n",
            errors, warnings, css, head_script, h->cards);
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
        human_bytes(lb, sizeof lb, r->sum.leaked_bytes);
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
    fprintf(o, "</main>\n<div id=\"selfcheck\" data-ok=\"\">self-check did not run (JavaScript off)"
               "</div>\n<script>%s</script>\n</body></html>\n", script);

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
