/* The trace reader's private state and the calls between its files, one
 * way down (see reader.h for the one-pass design):
 *   reader.c         opens and checks the file, runs the pass, closes
 *   tracescan.c      the pass: framing of every record, damage, re-judging
 *   tracerecords.c   one parser per record type
 *   tracetables.c    the stack tree and code objects, the table lookups
 *   tracecounts.c    the COUNTS series, downsampled
 *   traceoptions.c   the OPTIONS record: protect, suppressions, max_findings
 *   tracefindings.c  judging events, keeping (and spilling) the findings
 * Private to those files. */
#ifndef CAPSAN_READER_INT_H
#define CAPSAN_READER_INT_H

#include <stdio.h>
#include "reader.h"

typedef struct frame_slot {
    uint32_t id;              /* 0 = empty slot (node 0 is never stored) */
    uint32_t parent;
    uint64_t value;
} frame_slot;

typedef struct code_slot {
    uint32_t id;
    uint32_t index_plus1;     /* 0 = empty slot */
} code_slot;

struct cs_trace_priv {
    const uint8_t *map;
    size_t size;
    frame_slot *frames;       /* open addressing, power-of-two capacity */
    size_t frames_cap, frames_n;
    cs_code_rec *codes;
    size_t ncodes, codes_cap;
    code_slot *code_index;
    size_t code_index_cap;
    size_t modules_cap, threads_cap;

    /* the replay */
    cs_lifecycle *lc;
    int protect;              /* what the lifecycle judges with */
    int rereplay;             /* OPTIONS changed protect after events were judged */
    uint64_t judged;          /* events given to lc */
    /* findings: the first FMEM_MAX in memory, the rest in an unlinked file */
    cs_finding *fmem;
    size_t fmem_n, fmem_cap;
    FILE *spill;
    uint64_t spill_n;
    int spill_failed;
    /* LIVE: the crash-safe live state, filled slots only */
    cs_live_slot *live;
    size_t nlive, live_cap;
    /* COUNTS: the bucket being filled while downsampling */
    cs_rec_counts bucket;
    uint64_t bucket_n;
    size_t counts_cap;
};

/* tracetables.c */
void trace_frames_put(struct cs_trace_priv *p, uint32_t id, uint32_t parent, uint64_t value);
void trace_codes_put(struct cs_trace_priv *p, uint32_t id, uint32_t firstlineno,
                     const char *file, size_t flen, const char *name, size_t nlen);

/* tracefindings.c: the lifecycle's callback (ud is the cs_trace), the
 * reset before a re-judging, and one event judged */
void trace_store_finding(void *ud, const cs_finding *f);
void trace_findings_clear(cs_trace *t);
void trace_judge(cs_trace *t, const cs_event *ev);

/* tracecounts.c: one COUNTS record in; the series sorted at the end */
void trace_counts_add(cs_trace *t, const cs_rec_counts *c);
void trace_counts_finish(cs_trace *t);

/* traceoptions.c: t->options parsed again after an OPTIONS record */
void trace_apply_options(cs_trace *t);

/* tracerecords.c: the payload after the cs_rec header; NULL when the
 * record is fine, else why it is corrupt */
const char *trace_parse_record(cs_trace *t, unsigned type, const uint8_t *p,
                               size_t n, uint64_t off);

/* tracescan.c: the one pass over the mapping; the second, only when an
 * OPTIONS record changed protect after events were judged */
void trace_scan(cs_trace *t);
void trace_rejudge(cs_trace *t);

/* tracerecords.c: the CRASH record's stacks */
void trace_crash_free(cs_trace *t);

#endif
