/* Stack merging and report rendering, shared by the runtime's live reports
 * (in-process, dladdr symbols) and `capsan report` (offline, libdw).
 *
 * The caller supplies a cs_stack_source that knows how to walk a stack id
 * to raw frame values and how to name native addresses and code ids; the
 * renderers never touch the trace or the process themselves. */
#ifndef CAPSAN_RENDER_H
#define CAPSAN_RENDER_H

#include <stddef.h>
#include <stdint.h>
#include "lifecycle.h"

typedef struct cs_frame_info {
    int python;            /* 1: Python frame, 0: native */
    const char *function;  /* Python qualname or native symbol; NULL if unknown */
    const char *file;      /* source file; NULL if unknown */
    uint32_t line;         /* 0 if unknown */
    const char *module;    /* native: module path; NULL if unknown */
    uint64_t address;      /* native: the return address as recorded */
    uint64_t offset;       /* native: address - module base */
    const char *build_id;  /* native: hex build id, or NULL */
    int inlined;           /* native: an inlined frame at the same address */
} cs_frame_info;

typedef struct cs_stack_source {
    void *ud;
    /* raw frame values of a stack, innermost first; returns the count */
    int (*raw)(void *ud, uint32_t stack, uint64_t *values, int max);
    /* describe a native return address: up to max frames (inlined first);
     * returns the count, at least 1 (module+offset or the bare address) */
    int (*native)(void *ud, uint64_t ip, cs_frame_info *out, int max);
    /* file and qualname of a Python code id; 0 if unknown */
    int (*code)(void *ud, uint32_t code_id, const char **file, const char **name);
} cs_stack_source;

#define CS_MAX_FRAMES 256

/* Raw values -> merged frames, innermost first: each native frame of
 * _PyEval_EvalFrameDefault is replaced by the Python frames it ran (split
 * at entry frames); Python frames without a matching native frame go after
 * the native ones. Returns the count. */
int cs_stack_frames(const cs_stack_source *src, uint32_t stack,
                    cs_frame_info *out, int max);

/* A stack as the reports show it, hashed: Python frames and the native
 * frames of every module but the interpreter's own (python3.X,
 * libpython), whose frames change as it specializes a line. Two stacks
 * with one key print alike. */
uint64_t cs_stack_display_key(const cs_stack_source *src, uint32_t stack);

/* The innermost Python frame of a stack, if any: returns 1 and fills out. */
int cs_stack_python_top(const cs_stack_source *src, uint32_t stack,
                        cs_frame_info *out);

/* Output sink: the runtime writes to fd 2, the reporter to a FILE*. */
typedef struct cs_out {
    void (*write)(void *ud, const char *s, size_t n);
    void *ud;
    int color;             /* ANSI colour (only on a terminal) */
} cs_out;

/* One frame as the text report prints it ("    #k ..."). */
void cs_render_text_frame(cs_out *o, int k, const cs_frame_info *f);

void cs_outf(cs_out *o, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* one byte, a control byte as \xNN (text that came from the traced process) */
void cs_out_char(cs_out *o, unsigned char ch);

/* Process identity for report headers. */
typedef struct cs_proc_info {
    uint64_t pid, ppid;
    int ended;             /* cs_end_how */
    int status;            /* exit status or signal */
    uint64_t start_mono_ns;
} cs_proc_info;

/* LeakSanitizer-style text: one block per finding
 *   =================================================================
 *   ==PID==ERROR: capsan: dlpack-double-delete: <message>
 *     exported at (thread T1):
 *       #0 x.py:12 in <module>
 *       #1 0x7f.. in at::toDLPack (libtorch_python.so+0x1234)
 * and a closing SUMMARY line. */
void cs_render_text_finding(cs_out *o, const cs_proc_info *p,
                            const cs_finding *f, const cs_stack_source *src);

/* LeakSanitizer-style block for `count` leaks (`bytes` in all) of one kind
 * whose first event has the same stack; first is the first of them:
 *   ==PID==ERROR: capsan: dlpack-leak: Direct leak of 1600 byte(s) in 2 object(s) exported from:
 *       #0 ...                          (the stack of the first event)
 *     the first of them: <message>
 *     consumed at (thread T1):          (its other events)
 *       #0 ...
 *   Indirect leak of N byte(s) in M object(s) allocated from:   (if any) */
struct cs_leak_group;
void cs_render_text_leak_group(cs_out *o, const cs_proc_info *p, const struct cs_leak_group *g,
                               const cs_stack_source *src);

/* "Omitting N more finding(s)." (max_findings); with a pid, prefixed
 * ==PID==capsan: as the live report's lines are. */
void cs_render_text_omitted(cs_out *o, uint64_t pid, unsigned n, long max_findings);

/* 1 for the *-leak kinds */
int cs_kind_is_leak(int kind);
/* Why an exit had no leak check (CS_END_API_EXIT, CS_END_STOPPED_EXIT),
 * for the reports' "ended" line; NULL for every other ending. */
const char *cs_end_unchecked_why(int how);
/* reported grouped by the stack that made them: leaks, and what was live
 * at _exit */
int cs_kind_is_grouped(int kind);

typedef struct cs_summary {
    unsigned errors, warnings, suppressed;
    char first[320];           /* the first error's kind and Python file:line, as SUMMARY ends */
    uint64_t leaked_bytes;
    unsigned leak_objects;
    uint64_t indirect_bytes;   /* kept alive only by the leaks above */
    unsigned indirect_objects;
    uint64_t events;
    unsigned per_kind[CS_KIND_COUNT];
} cs_summary;

void cs_summary_add(cs_summary *s, const cs_finding *f);
/* Remember where the first error happened (its latest event's innermost
 * Python frame), for the SUMMARY line, as ASan's names its first frame. */
void cs_summary_locate(cs_summary *s, const cs_finding *f, const cs_stack_source *src);

/* strip_path_prefix: file and module paths in text reports lose
 * everything up to and including the first occurrence of prefix ("" or
 * NULL: none), as the sanitizers' option of that name. */
void cs_render_strip_prefix(const char *prefix);
/* "SUMMARY: capsan: 2 errors (dlpack-double-delete: 1, ...), 1 warning; 800 bytes leaked in 1 object" */
void cs_render_text_summary(cs_out *o, const cs_proc_info *p, const cs_summary *s);

#endif
