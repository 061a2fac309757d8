/* Trace file reader for `capsan report` (format: reports/FORMAT.md).
 *
 * One pass over a read-only mapping, so that memory never grows with the
 * number of events: cs_trace_open() walks every record once, validating
 * it, loading the small tables (process, modules, code objects, stack
 * tree, threads, END), downsampling the COUNTS series, and feeding each
 * event to a lifecycle, which owns all per-object state. Events are never
 * kept; the findings the lifecycle reports are (in memory, spilled to an
 * unlinked temporary file past a few thousand), and cs_trace_replay()
 * hands them out afterwards, when every table they may refer to is
 * complete: a FRAME or CODE record may follow the event that uses it. */
#ifndef CAPSAN_READER_H
#define CAPSAN_READER_H

#include <stddef.h>
#include <stdint.h>
#include "tracefmt.h"
#include "lifecycle.h"
#include "render.h"

typedef struct cs_module_rec {
    uint64_t base, lo, hi;
    uint8_t *build_id;        /* build_id_len bytes, or NULL */
    uint32_t build_id_len;
    char *path;               /* as recorded; may be "" */
    uint64_t offset;          /* file offset of its record (load order) */
} cs_module_rec;

typedef struct cs_code_rec {
    uint32_t id, firstlineno;
    char *file, *name;
} cs_code_rec;

typedef struct cs_thread_rec {
    uint32_t thread;
    uint64_t os_tid;
    char *name;
} cs_thread_rec;

typedef struct cs_trace {
    char *path;               /* the file as named on the command line */
    cs_file_header hdr;

    /* CS_REC_PROCESS (the last one wins); argv NULL-terminated */
    int has_process;
    unsigned argc;
    char **argv;
    char *exe;
    char *options;            /* CS_REC_OPTIONS, or NULL */
    long opt_max_findings;    /* max_findings in OPTIONS, -1 if absent */
    char *opt_suppressions;   /* suppressions in OPTIONS, NULL if absent or empty */
    char *opt_strip_prefix;   /* strip_path_prefix in OPTIONS, NULL if absent or empty */

    cs_module_rec *modules;   /* in file order */
    size_t nmodules;
    cs_thread_rec *threads;
    size_t nthreads;

    int has_end;
    cs_rec_end end;           /* zeroed (CS_END_UNKNOWN) without an END record */

    /* CS_REC_CRASH (the last one wins): the crashing thread's stacks as
     * the crash handler walked them; crash_ips[0] is the pc itself */
    uint64_t crash_tid;
    uint64_t *crash_ips;
    size_t crash_nnative;
    cs_frame_info *crash_py;  /* python = 1, file and function owned */
    size_t crash_npy;

    /* CS_REC_COUNTS, time-sorted, at most CS_COUNTS_MAX points: past that
     * runs of counts_stride records are merged into one point that keeps
     * the time of its last record and the maximum of every series */
    cs_rec_counts *counts;
    size_t ncounts;
    uint64_t counts_records;  /* COUNTS records read */
    uint64_t counts_stride;   /* records per point: 1 unless downsampled */
    uint64_t counts_events;   /* the largest `events` of any COUNTS record */
    uint64_t nfindings;       /* findings the replay reported */

    uint64_t nevents;         /* EVENT records */
    uint64_t nrecords;        /* all records before the end of data */
    uint64_t nunknown;        /* records of types this reader does not know */
    uint64_t nuncommitted;    /* sized records whose type was never written */
    uint64_t data_end;        /* offset where reading stopped */
    int error;                /* a corrupt record stopped the reading */
    char errmsg[512];         /* "<path>: corrupt record at offset 0x..." */
    uint64_t trailing_offset; /* nonzero data found after the end-of-data
                                 marker (0 if none): a writer killed mid-record */

    struct cs_trace_priv *priv;
} cs_trace;

/* -D for the fuzz build (Makefile): small limits let 64 KiB inputs reach
 * the downsampling and spilling paths */
#ifndef CS_COUNTS_MAX
#define CS_COUNTS_MAX 2000
#endif

/* Opens and reads a trace: tables, COUNTS, and the replay of every event,
 * in file order, through a fresh lifecycle (threadsafe = 0) finished with
 * the END record's how (CS_END_UNKNOWN when there is none). Returns NULL
 * (and a message in err) when the file cannot be read or is not a capsan
 * trace of a version this reader understands. A corrupt record later in
 * the file is not fatal: the trace is returned with error set, holding
 * everything before it. */
cs_trace *cs_trace_open(const char *path, char *err, size_t errlen);
void cs_trace_close(cs_trace *t);

/* Hands the findings of the replay to cb, in the order the lifecycle
 * reported them; may be called again. Returns the number of events. */
uint64_t cs_trace_replay(cs_trace *t, cs_finding_cb cb, void *ud);

/* Table lookups; NULL / 0 when unknown. */
const cs_code_rec *cs_trace_code(const cs_trace *t, uint32_t code_id);
const cs_thread_rec *cs_trace_thread(const cs_trace *t, uint32_t thread);
/* The module that covers ip: the most recently loaded one if several did. */
const cs_module_rec *cs_trace_module(const cs_trace *t, uint64_t ip);
/* Raw frame values of a stack id, innermost first (see tracefmt.h).
 * Stops at the root, at an unknown node or after max values. */
int cs_trace_stack(const cs_trace *t, uint32_t stack, uint64_t *values, int max);

void cs_trace_proc_info(const cs_trace *t, cs_proc_info *out);

/* Events the process observed: the trace keeps only those of objects with
 * findings (unless record_all=1); END and COUNTS records count them all. A
 * killed process has no END, but its last COUNTS says how far it got. */
uint64_t cs_trace_events_observed(const cs_trace *t);

#endif
