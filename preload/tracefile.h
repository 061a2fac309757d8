/* The trace writer: records go straight into a MAP_SHARED mapping of the
 * output file, so whatever was written survives SIGKILL or a crash. Space
 * is reserved with one atomic add; the file grows in chunks mapped ahead of
 * the writers. The file is created on the first record, so a process that
 * never produces an event leaves no trace. */
#ifndef CAPSAN_TRACEFILE_H
#define CAPSAN_TRACEFILE_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include "tracefmt.h"

/* Called once the file is created (and again in a forked child's new file)
 * before any other record: writes process, options and modules. */
typedef void (*cs_trace_prologue_fn)(void);
void cs_trace_init(const char *prefix, cs_trace_prologue_fn prologue);

/* Reserve a record of `size` payload bytes and return a pointer to its
 * payload; commit with cs_trace_commit. NULL if the trace is unusable. */
void *cs_trace_begin(uint16_t type, size_t payload, cs_rec **hdr_out);
void cs_trace_commit(cs_rec *hdr, uint16_t type);

/* One call for a fixed payload. */
int cs_trace_write(uint16_t type, const void *payload, size_t n);
/* A payload made of a fixed struct followed by strings (each copied with
 * its NUL). */
int cs_trace_write_strs(uint16_t type, const void *fixed, size_t n, const char *const *strs,
                        int nstrs);

/* The file's generation: bumped when a forked child starts a new file, so
 * interned stacks and code objects know to be written again. */
extern _Atomic uint32_t cs_trace_generation;
static inline uint32_t cs_trace_gen(void)
{
    return atomic_load_explicit(&cs_trace_generation, memory_order_relaxed);
}
const char *cs_trace_path(void); /* "" until created */
int cs_trace_started(void);

void cs_trace_atfork_child(void);
/* fork(): hold (1) or release (0) the growth lock around it. */
void cs_trace_fork_lock(int lock);
/* Flush to disk (msync) and stop writing. */
void cs_trace_close(void);

/* CLOCK_MONOTONIC in ns, cheaply (TSC-based when invariant). */
uint64_t cs_now_ns(void);
void cs_clock_init(void);

#endif
