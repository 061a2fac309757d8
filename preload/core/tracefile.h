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
#include <x86intrin.h>
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
/* the same, absolute as of its creation */
const char *cs_trace_abs_path(void);
int cs_trace_started(void);
int cs_trace_failed(void); /* it could not be created */
/* From a crash handler: a trace no record has opened yet is opened now
 * (async-signal-safe: no lock, no allocation), and `fn` writes what a
 * reader needs before the END, instead of the prologue (which locks and
 * allocates). Returns 1 when the trace is open. */
int cs_trace_open_crash(cs_trace_prologue_fn fn);

void cs_trace_atfork_child(void);
/* fork(): hold (1) or release (0) the growth lock around it. */
void cs_trace_fork_lock(int lock);
/* Flush to disk (msync) and stop writing. */
void cs_trace_close(void);

/* CLOCK_MONOTONIC in ns, cheaply (TSC-based when invariant): inline
 * while the current calibration holds, else through the kernel's clock
 * and a re-anchoring. */
typedef struct cs_clk {
    uint64_t tsc0, ns0;
    uint64_t mult; /* ns per tick, 32.32 fixed point */
    uint64_t next; /* tick at which to re-anchor */
} cs_clk;
extern _Atomic(const cs_clk *) cs_cur_clk; /* NULL: no invariant TSC, or not yet */
uint64_t cs_now_ns_slow(void);
static inline uint64_t cs_now_ns(void)
{
    const cs_clk *c = atomic_load_explicit(&cs_cur_clk, memory_order_acquire);
    if (__builtin_expect(c != NULL, 1)) {
        uint64_t t = __rdtsc();
        if (__builtin_expect(t < c->next, 1))
            return c->ns0 + (uint64_t)(((unsigned __int128)(t - c->tsc0) * c->mult) >> 32);
    }
    return cs_now_ns_slow();
}
void cs_clock_init(void);

#endif
