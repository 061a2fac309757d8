/* HTML report writer: one self-contained page (inline CSS, JS and SVG; a
 * Content-Security-Policy that forbids every network load) with
 *   - a summary table of the processes, children indented under parents;
 *   - per process: how it ended, a plot of live NumPy bytes and live DLPack
 *     tensors over time (the trace's COUNTS records), and one card per
 *     finding with its message, a lifecycle timeline of its object and a
 *     collapsible, merged (Python + native) stack per event.
 * The page reads without JavaScript; the script adds the plot read-out,
 * kind filters, expand/collapse, and a self-check that writes what it
 * found (cards, plot points, script errors) into <div id="selfcheck">.
 *
 * Streaming like json.h: begin, then per process process_begin, findings,
 * process_end; end writes the whole page. The body is staged in a
 * temporary file because the summary table at the top needs every
 * process's totals. Report tool only: uses stdio. Every string from a
 * trace is escaped (HTML metacharacters, control bytes, invalid UTF-8). */
#ifndef CAPSAN_HTML_H
#define CAPSAN_HTML_H

#include <stdint.h>
#include <stdio.h>
#include "render.h"

typedef struct cs_html cs_html;

typedef struct cs_html_proc {
    const cs_proc_info *info;
    const char *const *argv;  /* argc strings */
    unsigned argc;
    const char *exe;          /* or NULL */
    const char *trace;        /* trace file */
    const char *error;        /* a read error, or NULL */
    uint64_t end_time_ns;     /* END record's time (CLOCK_MONOTONIC), 0 if unknown */
    uint64_t end_pc, end_fault_addr;
    const char *end_function; /* symbolized end pc, or NULL */
    const cs_frame_info *crash; /* the crashing thread's frames, or NULL */
    int ncrash;
    uint64_t parent_pid;      /* the parent's pid when its trace is in the report, else 0 */
    int depth;                /* in the process tree */
    uint64_t data_end;        /* where reading stopped */
    int truncated;            /* no END record */
    int saved;                /* a pytest report, not a trace: no series to plot */
    /* COUNTS series (reader.h) */
    const cs_rec_counts *counts;
    size_t ncounts;
    uint64_t counts_records, counts_stride;
} cs_html_proc;

/* NULL when the staging file cannot be made (message in err) */
cs_html *cs_html_begin(FILE *out, char *err, size_t errlen);
void cs_html_process_begin(cs_html *h, const cs_html_proc *p);
void cs_html_finding(cs_html *h, const cs_finding *f, const cs_stack_source *src);
/* Identical leaks (same kind and making stack) as one card with their
 * count and bytes, as the text report groups them. */
struct cs_leak_group;
void cs_html_leak_group(cs_html *h, const struct cs_leak_group *g, const cs_stack_source *src);
/* A heading over the findings that follow (a pytest report's test) */
void cs_html_heading(cs_html *h, const char *text);
/* findings not shown (max_findings) */
void cs_html_omitted(cs_html *h, unsigned n, long max_findings);
void cs_html_process_end(cs_html *h, const cs_summary *s);
/* A file that could not be read at all. */
void cs_html_unreadable(cs_html *h, const char *path, const char *error);
/* Writes the page to out; 0 on success. Frees h. */
int cs_html_end(cs_html *h);

/* Escaped text, as the page writes it (exposed for tests) */
void cs_html_text(FILE *out, const char *s);

#endif
