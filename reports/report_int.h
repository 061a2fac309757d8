/* `capsan report`'s private state and the calls between its files, one
 * way down (see report.h for the command):
 *   report.c          the command: flags, the output file, the run
 *   reportsaved.c     one pytest report, rendered as a trace is
 *   reporttrace.c     one trace: its process's begin, findings and end
 *   reportfindings.c  each finding to its format, leaks grouped
 *   reportgensupp.c   --gen-suppressions: a line per finding, each once
 *   reporttext.c      text pieces: argv, ending, header, tree line
 *   reporttree.c      the traces as a process tree: order and printout
 * Private to those files. */
#ifndef CAPSAN_REPORT_INT_H
#define CAPSAN_REPORT_INT_H

#include <stdio.h>
#include <stdint.h>
#include "html.h"
#include "json.h"
#include "leakgroups.h"
#include "reader.h"
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
    const char *strip_flag;   /* --strip-path-prefix, or NULL */
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

/* "PID ARGV: ENDED; E error(s), W warning(s)" for the process tree */
typedef struct membuf {
    char *s;
    size_t n, cap;
} membuf;

/* reporttree.c */
void report_read_header(entry *e);
size_t *report_tree_order(entry *e, size_t n);
void report_text_tree(cs_out *o, entry *e, const size_t *order, size_t n);

/* reporttext.c */
void report_out_args(cs_out *o, const char *const *argv, unsigned argc, int known, size_t max);
const char *report_end_function(report_ctx *c);
void report_text_header(report_ctx *c, const entry *e, const entry *parent);
void report_mem_write(void *ud, const char *s, size_t n);
char *report_tree_line(report_ctx *c);

/* reportgensupp.c */
void report_gen_suppression(report_ctx *c, const cs_finding *f);

/* reportfindings.c */
void report_groups_render(report_ctx *c);
void report_on_finding(void *ud, const cs_finding *f);

/* reporttrace.c, reportsaved.c */
int report_one(entry *e, const entry *parent, report_ctx *c, FILE *errf);
int report_saved(entry *e, report_ctx *c, FILE *errf);

/* reporttext.c: the crashing thread's frames (CRASH record) */
#define REPORT_CRASH_FRAMES 96
int report_crash_frames(report_ctx *c, cs_frame_info *out, int max);

#endif
