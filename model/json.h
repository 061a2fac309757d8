/* JSON report writer (the contract in DESIGN.md, "format": 1).
 *
 * Streaming: a document is begin, then per process process_begin, any
 * number of findings, process_end, and finally end. Output goes through a
 * cs_out sink and nothing is allocated, so the runtime could link this file
 * as well as the report tool. */
#ifndef CAPSAN_JSON_H
#define CAPSAN_JSON_H

#include <stddef.h>
#include <stdint.h>
#include "render.h"

typedef struct cs_json {
    cs_out *o;
    unsigned nproc;           /* processes written so far */
    unsigned nfind;           /* findings written in the current process */
    /* more members of the finding being written, after the others (the
     * report tool's pytest reports: its test); set after cs_json_begin */
    void (*finding_extra)(void *ud, cs_out *o);
    void *extra_ud;
} cs_json;

typedef struct cs_json_proc {
    const cs_proc_info *info;
    const char *const *argv;  /* argc strings */
    unsigned argc;
    const char *exe;          /* or NULL */
    const char *trace;        /* trace file, or NULL */
    const char *error;        /* a read error, or NULL */
    uint64_t end_time_ns;     /* END record's time, 0 if unknown */
    /* the report tool only (zero elsewhere): */
    uint64_t parent_pid;      /* the parent's pid when its trace is in the report */
    const cs_rec_counts *counts; /* COUNTS series, time-sorted, maybe downsampled */
    size_t ncounts;
    uint64_t counts_records, counts_stride;
    const cs_frame_info *crash; /* the crashing thread's frames (CRASH record), or NULL */
    int ncrash;
    uint64_t crash_tid;
} cs_json_proc;

void cs_json_begin(cs_json *j, cs_out *o);
void cs_json_process_begin(cs_json *j, const cs_json_proc *p);
void cs_json_finding(cs_json *j, const cs_proc_info *p, const cs_finding *f,
                     const cs_stack_source *src);
void cs_json_process_end(cs_json *j, const cs_summary *s);
void cs_json_end(cs_json *j);

/* A JSON string literal: quotes, escapes, control characters as \u00XX and
 * bytes that are not valid UTF-8 as \ufffd. NULL writes null. */
void cs_json_string(cs_out *o, const char *s);

#endif
