/* The finding cards of the HTML report: a finding (or a group of identical
 * leaks) with its message, a lifecycle timeline of its object (SVG), and
 * per event a collapsible, merged (Python + native) stack. */
#include "html_int.h"
#include "leakgroups.h"

#include <string.h>

#define HTML_MAX_FRAMES 128
/* timeline geometry */
#define TW 820.0
#define TLABEL 330.0          /* label column */
#define TROW 22.0
#define TTOP 20.0

static const char *base_name(const char *path)
{
    const char *s = path ? strrchr(path, '/') : NULL;
    return s ? s + 1 : path;
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
    html_human_time(a, sizeof a, rel_ns(h, t0));
    html_human_time(b, sizeof b, rel_ns(h, t1));
    html_human_time(d, sizeof d, span);
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
        html_human_time(tt, sizeof tt, rel_ns(h, t));
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
    html_human_time(tt, sizeof tt, rel_ns(h, ev->time_ns));
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

/* The crashing thread's stack (the CRASH record), open, above the plot */
void html_crash(cs_html *h, const cs_frame_info *fr, int n)
{
    bodyf(h, "<details class=\"event crash\" open><summary><b>the crashing thread</b></summary>\n"
             "<ol class=\"stack\" start=\"0\">\n");
    for (int k = 0; k < n; k++)
        frame_html(h, &fr[k]);
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
        html_human_bytes(bytes, sizeof bytes, (double)total);
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
        html_human_bytes(bytes, sizeof bytes, (double)ind_bytes);
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
