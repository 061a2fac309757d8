/* The service every hook calls: the one lifecycle, the emit path and the
 * trace's prologue (runtime.c). Start-up and the process-level hooks
 * (dlopen, exit, fork, crash signals) are start.c's, which starts this
 * service, the ending (ending.c) and every hook module; nothing here calls
 * a hook module or the ending. */
#ifndef CAPSAN_RUNTIME_H
#define CAPSAN_RUNTIME_H

#include <stdint.h>
#include "lifecycle.h"
#include "pyapi.h"
#include "thread.h"

extern cs_lifecycle *cs_lc;
/* Recording is on (started, not stopped, not finished). Hooks that only
 * observe return early when it is 0; trampolines still forward calls. */
extern volatile int cs_recording;

/* Record one event: capture the stack (unless want_stack is 0 and
 * ev->stack is already set, whose stack id is reused), judge it, write it.
 * `export_out`, when not NULL, receives the object's export event read
 * under the same lock, so a trampoline learns the original deleter
 * atomically with the verdict; *found says what the object was just
 * before (cs_lc_judge: 1 live, 2 released, 0 unknown). Returns the
 * lifecycle verdict with CS_VERDICT_SKIP only when protect=1. ev->stack
 * is filled in. */
unsigned cs_emit(cs_event *ev, int want_stack, cs_event *export_out, int *found);
/* A NumPy block's NP_ALLOC or NP_FREE: judged on its thread while the
 * block is young (young.c), else by the lifecycle as cs_emit does. */
void cs_emit_np(cs_event *ev);
/* want_stack: 0 none (reuse ev->stack), 1 native and Python, or: */
#define CS_STACK_PYTHON 2 /* Python frames only while the GIL is held */
/* This thread's stack now, for an event emitted later (its id goes in
 * ev->stack; cs_emit with want_stack 0 keeps it); 0 when not recording or
 * inside capsan. `site` as for cs_stack_capture. */
uint32_t cs_stack_now(int want_stack, unsigned site);

/* A Python-facing call at `site` (a return address) by a thread without
 * the GIL: reported once per site (CS_NOGIL_*). Cheap when the GIL is held.
 * Returns event flags that hand the answer on to cs_emit (CS_EVF_GIL_KNOWN,
 * with CS_EVF_GIL if held), or 0 when it did not look: a hook's events are
 * emitted in the GIL state the hook was entered in. */
unsigned cs_check_gil_slow(const void *site, int what);
static inline unsigned cs_check_gil(const void *site, int what)
{
    if (!cs_recording || !cs_py.ok)
        return 0;
    if (cs_gil_held())
        return CS_EVF_GIL_KNOWN | CS_EVF_GIL;
    return cs_check_gil_slow(site, what);
}
/* Set while a deleter entered without the GIL runs on this thread. */
void cs_deleter_nogil(int on);
extern __thread int cs_in_nogil_deleter __attribute__((tls_model("initial-exec")));

/* Live findings: the lifecycle callback; prints and counts them. */
void cs_findings_init(int api_mode); /* loads the suppressions option */
void cs_findings_cb(void *ud, const cs_finding *f);
void cs_findings_flush_pending(void);
/* findings this thread's events made and flush has not printed yet */
extern __thread unsigned cs_findings_npending __attribute__((tls_model("initial-exec")));
static inline void cs_findings_flush(void)
{
    if (cs_findings_npending)
        cs_findings_flush_pending();
}
/* At exit: the same, with leaks grouped by where they were made. */
void cs_findings_flush_exit(void);
unsigned cs_findings_errors(void);
/* the findings' own buffers (they hold object addresses), for reach.c */
void cs_findings_own_memory(void (*fn)(void *ud, const void *p, size_t n), void *ud);
unsigned cs_findings_total(void);
/* From a crash handler: fn for each of the last `max` findings reported;
 * none when the lock is held (the crash may be in the printing). Returns
 * how many. */
unsigned cs_findings_crash_list(unsigned max, void (*fn)(void *ud, const cs_finding *f), void *ud);
/* every finding the lifecycle made, suppressed ones included */
unsigned cs_findings_judged(void);
void cs_findings_summary(void);

/* Started by `import capsan` (not preloaded): findings go to Python only. */
int cs_runtime_api_mode(void);

/* Set up by start.c: the runtime started (api: by `import capsan`), the
 * lifecycle's sink and the trace's prologue, a forked child's fresh
 * COUNTS series, what halt_on_error calls (cs_ending_halt), what a
 * thread's first event with the GIL calls (cs_exitroots_arm_threads). */
void cs_runtime_begin(int api);
extern void (*cs_runtime_halt)(void);
extern void (*cs_runtime_python_thread)(void);
void cs_runtime_sink(void *ud, const cs_event *ev);
void cs_runtime_prologue(void);
/* the same from a crash handler (cs_trace_open_crash): the process, the
 * options and the modules, with no lock and no allocation */
void cs_runtime_crash_prologue(void);
void cs_runtime_fork_child(void);
/* started and not finished */
int cs_runtime_running(void);
/* 1 the first time it is called after the start: the process's ending
 * is the caller's (ending.c) */
int cs_runtime_end_once(void);
/* a COUNTS record now (the memory plot's point) */
void cs_runtime_write_counts(uint64_t now);

#endif
