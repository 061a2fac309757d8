/* Stacks: native frames from libunwind and Python frames from the
 * interpreter, interned as paths in a prefix tree (CS_REC_FRAME records)
 * so an event stores one id. */
#ifndef CAPSAN_STACK_H
#define CAPSAN_STACK_H

#include <stdint.h>
#include "thread.h"

struct cs_stack_cache;

/* Load libunwind privately; `self` is any address inside libcapsan.so. */
void cs_stack_init(const void *self);
/* Start libunwind, once the slots of loaded objects are patched. */
void cs_stack_start(void);
/* Capture this thread's stack now. With `python_only` and the GIL held,
 * no native frames (the Python line is what tells). Returns the leaf id
 * (0 when stacks are off), its records already in the trace. `site`
 * (< 32, the event kind) keys how deep the eval loop was last time on
 * this thread, so unwinding can stop about there. */
uint32_t cs_stack_capture(cs_thread *t, int gil, int python_only, unsigned site);
/* A hook about to emit may name the stack slot that holds its own return
 * address (CS_STACK_HINT() in the hook): the next capture on this thread
 * starts there instead of walking capsan's frames to it. Used once. */
extern __thread const uintptr_t *cs_stack_hint __attribute__((tls_model("initial-exec")));
#define CS_STACK_HINT() (cs_stack_hint = CS_CALLER_SLOT())
/* the slot holding this function's return address: a callback that foreign
 * code calls passes it on to the body that emits, whose own frame's slot
 * holds an address in capsan */
#define CS_CALLER_SLOT() ((const uintptr_t *)__builtin_frame_address(0) + 1)
/* Is this thread running an import: an importlib frame below the Python
 * frames its last capture recorded (all of them if it recorded none)?
 * What it allocates then is module data, also when the import lies
 * deeper than python_depth, or python_depth is 0. */
int cs_stack_importing(cs_thread *t, int gil);
/* Where this thread's Python code stands: its innermost frame that runs
 * code and the instruction that frame is at. A C function called from
 * Python leaves both as they are until it returns (frames it calls back
 * into lie above). 0 when there is none (or no layout). */
typedef struct cs_py_pos {
    uint64_t frame, instr;
} cs_py_pos;
int cs_stack_py_pos(int gil, cs_py_pos *pos);
/* 1 while the C call made at pos has not returned: pos's frame is still in
 * this thread's chain and still at that instruction. */
int cs_stack_py_within(int gil, const cs_py_pos *pos);
/* This thread's PyThreadState (gil: held), for cs_stack_py_within_ts. */
const void *cs_stack_py_tstate(int gil);
/* cs_stack_py_within for another thread, by its PyThreadState: its frames
 * are read through probes (the thread may be running, or gone). Exact
 * while that thread runs without the GIL, as a C call that released it
 * does: its chain does not move then. */
int cs_stack_py_within_ts(const void *ts, const cs_py_pos *pos);
/* 1 if p lies on t's stack, 0 if not, -1 unknown (no capture made on
 * that thread yet, or its bounds are unknown). */
int cs_stack_holds(const cs_thread *t, const void *p);
/* Make sure a stack id captured earlier is in the current trace file (a
 * forked child's new file starts without the parent's stacks). */
void cs_stack_ensure(uint32_t id);
void cs_stack_cache_free(struct cs_stack_cache *c);
/* Flush libunwind's caches (after dlclose). */
void cs_stack_flush(void);

/* ---- a crash: called from a signal handler (no lock taken, nothing
 * allocated, the program's memory read through probes) ---- */
#define CS_CRASH_FRAMES 64
typedef struct cs_crash_walk {
    int n;
    uint64_t ip[CS_CRASH_FRAMES]; /* innermost first */
    uint8_t exact[CS_CRASH_FRAMES]; /* ip is the instruction, not a return address */
    /* the first signal trampoline frame past frame 0 (-1: none), and its
     * stack pointer: there lies the kernel's frame of an earlier signal,
     * its ucontext and then its siginfo */
    int sigframe;
    uint64_t sigframe_sp;
    int in_unwinder; /* the pc is in libunwind: not walked */
    int eval_at; /* the first frame in the eval loop (-1: none) */
} cs_crash_walk;
/* The native frames of the context a signal interrupted (a ucontext_t);
 * only the pc when libunwind is not there. Returns w->n. */
int cs_stack_crash_native(const void *uc, cs_crash_walk *w);
/* This thread's Python frames, innermost first: fn for each of the first
 * max (names that are not ASCII say "?"). Returns how many it has. */
int cs_stack_crash_python(int max, void (*fn)(void *ud, const char *file, const char *name, int line),
                          void *ud);

/* fork(): hold (1) or release (0) the tree's lock around it. */
void cs_stack_fork_lock(int lock);

/* In-process reading, for the live report. */
int cs_stack_raw(uint32_t id, uint64_t *vals, int max);
int cs_stack_code(uint32_t code_id, const char **file, const char **name);

#endif
