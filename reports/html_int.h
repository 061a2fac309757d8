/* The HTML report's private state and the calls between its files, one
 * way down (see html.h for the page):
 *   html.c        the page: a row and a section per process, then the
 *                 skeleton around the staged body and the summary table
 *   htmlplot.c    a process's plot of live bytes and tensors over time
 *   htmlcards.c   the finding cards: timeline, events, merged stacks
 *   htmlassets.c  the page's CSS and script
 *   htmltext.c    escaped text, byte sizes and durations as written
 * Private to those files. */
#ifndef CAPSAN_HTML_INT_H
#define CAPSAN_HTML_INT_H

#include <stdarg.h>
#include "html.h"

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

/* into the staged body (static inline: a copy per file, no call across) */
static inline void bodyf(cs_html *h, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static inline void bodyf(cs_html *h, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vfprintf(h->body, fmt, ap);
    va_end(ap);
}

#define T(s) cs_html_text(h->body, s)

/* htmltext.c: a double, since an axis label may lie beyond UINT64_MAX */
void html_human_bytes(char *buf, size_t n, double b);
void html_human_time(char *buf, size_t n, double ns);

/* htmlplot.c: the plot's figure, into the body */
void html_plot(cs_html *h, const cs_html_proc *p);

/* htmlassets.c */
extern const char html_css[], html_head_script[], html_script[];

/* htmlcards.c: the crashing thread's frames, in the process's header */
void html_crash(cs_html *h, const cs_frame_info *fr, int n);

#endif
