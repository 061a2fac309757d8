/* The service every hook calls (see runtime.h): the one lifecycle, the
 * emit path and the trace's prologue. It calls no hook module, nor the
 * ending (ending.c): start.c starts them all. */
#include "runtime.h"

#include <fcntl.h>
#include <stdatomic.h>
#include <stdio.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "modules.h"
#include "options.h"
#include "pyapi.h"
#include "seenset.h"
#include "spin.h"
#include "stack.h"
#include "tracefile.h"
#include "young.h"

cs_lifecycle *cs_lc;
volatile int cs_recording;
static atomic_int started, finished; /* cs_runtime_begin, cs_runtime_end_once */
/* started by `import capsan` rather than LD_PRELOAD: findings go to the
 * Python API; the exit status and exit-time report stay the program's */
static int api_mode;
static _Atomic uint64_t next_counts; /* when the next COUNTS record is due */

void cs_runtime_write_counts(uint64_t now)
{
    cs_lc_totals t = {0};
    uint64_t events = 0;
    if (cs_lc)
        cs_lc_tally(cs_lc, &t, &events);
    cs_rec_counts c = {.time_ns = now, .events = events,
                       .live_dlpack = (uint64_t)t.dlpack, .live_dlpack_bytes = (uint64_t)t.dlpack_bytes,
                       .live_numpy = (uint64_t)t.numpy, .live_numpy_bytes = (uint64_t)t.numpy_bytes};
    cs_trace_write(CS_REC_COUNTS, &c, sizeof c);
}

/* COUNTS records, the report's memory plot: one every 10 ms for the
 * first 10 s, then one per thousandth of the time run so far, so a run of
 * hours adds records (and trace pages) at a falling rate: about 2,300 per
 * tenfold of run time (6,000 in a first hour), not 360,000 an hour. */
static _Atomic uint64_t first_counts;

static __attribute__((noinline)) void counts_due(uint64_t now, uint64_t due)
{
    uint64_t t0 = atomic_load_explicit(&first_counts, memory_order_relaxed);
    if (!t0) {
        uint64_t zero = 0;
        atomic_compare_exchange_strong(&first_counts, &zero, now);
        t0 = atomic_load_explicit(&first_counts, memory_order_relaxed);
    }
    uint64_t step = (now - t0) / 1000;
    if (step < 10000000ull)
        step = 10000000ull;
    if (!atomic_compare_exchange_strong(&next_counts, &due, now + step))
        return;
    cs_runtime_write_counts(now);
}

/* every event asks: a load and a compare inline, the rest when due */
static inline __attribute__((always_inline)) void maybe_counts(uint64_t now)
{
    uint64_t due = atomic_load_explicit(&next_counts, memory_order_relaxed);
    if (__builtin_expect(now >= due, 0))
        counts_due(now, due);
}

/* ---- emit ---- */

static int ns_of(const cs_event *ev)
{
    return CS_EV_IS_NUMPY(ev->kind)   ? CS_NS_NUMPY
           : CS_EV_IS_ARROW(ev->kind) ? CS_NS_ARROW
                                      : CS_NS_DLPACK;
}

void (*cs_runtime_halt)(void);
void (*cs_runtime_python_thread)(void);

static inline __attribute__((always_inline)) cs_thread *emit_begin(cs_event *ev, int want_stack)
{
    cs_thread *t = cs_thread_get();
    if (!t || t->busy || !cs_recording || !cs_lc) {
        cs_stack_hint = NULL; /* a hook's slot is for this event's capture only */
        return NULL;
    }
    t->busy = 1;
    /* the THREAD record first: it opens the trace file, whose prologue
     * may take every lock below */
    cs_thread_note(t);
    int live = cs_py_live();
    unsigned known = ev->flags & (CS_EVF_GIL_KNOWN | CS_EVF_GIL);
    ev->flags &= (uint8_t)~(CS_EVF_GIL_KNOWN | CS_EVF_GIL);
    int gil = live && ((known & CS_EVF_GIL_KNOWN) ? (known & CS_EVF_GIL) != 0 : cs_gil_held());
    ev->thread = t->num;
    if (gil) {
        ev->flags |= CS_EVF_GIL;
        if (__builtin_expect(!t->python, 0)) {
            t->python = 1; /* may hold Python objects (cs_thread_python_left) */
            if (cs_runtime_python_thread)
                cs_runtime_python_thread();
        }
    }
    if (!live)
        ev->flags |= CS_EVF_NO_PYTHON;
    t->importing = t->py_walked = 0;
    if (want_stack && (cs_opt.native_depth > 0 || cs_opt.python_depth > 0))
        ev->stack = cs_stack_capture(t, gil, want_stack == CS_STACK_PYTHON, ev->kind);
    else if (ev->stack)
        cs_stack_ensure(ev->stack);
    cs_stack_hint = NULL;
    /* a NumPy block made by an import is module data; the frames the stack
     * did not record (all of them with Python stacks off) may show one.
     * The flag matters for NumPy blocks only: no other event walks them.
     * Without a frame layout (an interpreter capsan cannot prove) no one
     * can tell: such a block is taken as module data, never as a leak */
    if (t->importing ||
        (ev->kind == CS_EV_NP_ALLOC && live && __builtin_expect(!cs_py.layout, 0)) ||
        (want_stack && ev->kind == CS_EV_NP_ALLOC && (!t->py_walked || t->py_rest) &&
         cs_stack_importing(t, gil)))
        ev->flags |= CS_EVF_IMPORT;
    return t;
}

static inline __attribute__((always_inline)) unsigned emit_judge(cs_event *ev, cs_event *origin,
                                                                 int *found)
{
    cs_lc_lock(cs_lc, ev->obj);
    ev->time_ns = cs_now_ns(); /* in judging order, per object */
    unsigned v = cs_lc_judge(cs_lc, ev, origin, found);
    if ((v & CS_VERDICT_SKIP) && cs_opt.protect) {
        ev->flags |= CS_EVF_SKIPPED; /* the lifecycle marked its own copies */
    } else {
        v &= ~CS_VERDICT_SKIP;
    }
    if (cs_opt.record_all)
        cs_trace_write(CS_REC_EVENT, ev, sizeof *ev);
    cs_lc_unlock(cs_lc, ev->obj);
    return v;
}

/* halt_on_error ends the process with its report; abort_on_error stops it
 * where it is, for a core dump or a debugger (the default SIGABRT: no
 * crash report of capsan's over the finding's) */
static __attribute__((noinline, cold)) void stop_at_error(void)
{
    if (cs_opt.abort_on_error) {
        signal(SIGABRT, SIG_DFL);
        abort();
    }
    if (cs_runtime_halt)
        cs_runtime_halt();
}

static inline __attribute__((always_inline)) void emit_end(cs_thread *t, const cs_event *ev)
{
    maybe_counts(ev->time_ns);
    cs_findings_flush();
    t->busy = 0;
    if (__builtin_expect(cs_opt.halt_on_error | cs_opt.abort_on_error, 0) && cs_findings_errors())
        stop_at_error();
}

unsigned cs_emit(cs_event *ev, int want_stack, cs_event *origin, int *found)
{
    if (found)
        *found = 0;
#ifdef CS_BENCH_FLOOR
    /* make bench-floor: no event path at all (see the Makefile) */
    (void)ev, (void)want_stack, (void)origin;
    return 0;
#endif
    int dlpack = ns_of(ev) == CS_NS_DLPACK;
    cs_thread *t = emit_begin(ev, want_stack);
    if (!t) {
        /* not recording (or capsan's own call): still answer the lookup
         * a trampoline needs to forward its call */
        if (origin && cs_lc) {
            if (dlpack)
                cs_young_dl_adopt(ev->obj);
            cs_lc_lock(cs_lc, ev->obj);
            *found = cs_lc_origin(cs_lc, ns_of(ev), ev->obj, origin);
            if (*found && cs_lc_state(cs_lc, ns_of(ev), ev->obj) == CS_ST_RELEASED)
                *found = 2; /* as cs_lc_judge says it */
            cs_lc_unlock(cs_lc, ev->obj);
        }
        return 0;
    }
    if (dlpack) {
        if (cs_young_dl(t, ev, origin, found)) { /* judged on this thread */
            emit_end(t, ev);
            return 0;
        }
        cs_young_dl_adopt(ev->obj); /* whatever a thread holds of it, first */
    }
    unsigned v = emit_judge(ev, origin, found);
    emit_end(t, ev);
    return v;
}

/* inlined into numpy.c's hooks (one program, -flto): one prologue an
 * event, not two (W1 -375 instructions an iteration) */
__attribute__((always_inline)) inline void cs_emit_np(cs_event *ev)
{
#ifdef CS_BENCH_FLOOR
    (void)ev;
    return;
#endif
    int alloc = ev->kind == CS_EV_NP_ALLOC;
    /* a free's native frames are numpy's own dealloc path; where the
     * array died is the Python line */
    cs_thread *t = emit_begin(ev, alloc ? 1 : CS_STACK_PYTHON);
    if (!t)
        return;
    if (alloc ? !cs_young_alloc(t, ev) : !cs_young_free(t, ev)) {
        if (!alloc) /* whatever a thread holds of it moves to the lifecycle first */
            cs_young_adopt(ev->obj);
        emit_judge(ev, NULL, NULL);
    }
    emit_end(t, ev);
}

uint32_t cs_stack_now(int want_stack, unsigned site)
{
    cs_thread *t = cs_thread_get();
    if (!t || t->busy || !cs_recording || !cs_lc ||
        !(cs_opt.native_depth > 0 || cs_opt.python_depth > 0))
        return 0;
    t->busy = 1;
    cs_thread_note(t); /* the stack's records go into an open trace */
    int gil = cs_py_live() && cs_gil_held();
    uint32_t id = cs_stack_capture(t, gil, want_stack == CS_STACK_PYTHON, site);
    t->busy = 0;
    return id;
}

/* ---- calls without the GIL (R12, R33) ---- */

__thread int cs_in_nogil_deleter __attribute__((tls_model("initial-exec")));
#define NOGIL_SITES 1024
static uintptr_t nogil_sites[NOGIL_SITES];
static cs_spin nogil_mu = CS_SPIN_INIT;

void cs_deleter_nogil(int on) { cs_in_nogil_deleter = on; }

unsigned cs_check_gil_slow(const void *site, int what)
{
    if (!cs_py_live())
        return 0;
    if (cs_in_nogil_deleter)
        what = CS_NOGIL_IN_DELETER;
    if (cs_seen_first(nogil_sites, NOGIL_SITES, &nogil_mu, (uintptr_t)site ^ (uintptr_t)what)) {
        /* the trace says which rule was broken: the GIL's, or on a
         * free-threaded build an attached thread state's */
        cs_event ev = {.kind = CS_EV_NO_GIL, .obj = (uint64_t)(uintptr_t)site,
                       .aux = (uint16_t)what, .flags = CS_EVF_GIL_KNOWN,
                       .extra = cs_py.free_threaded ? CS_NOGIL_FREE_THREADED : 0};
        cs_emit(&ev, 1, NULL, NULL);
    }
    return CS_EVF_GIL_KNOWN;
}

/* ---- the trace prologue: who we are, what is loaded, what a forked
 * child inherited ---- */

typedef struct proc_bufs {
    char buf[8192], exe[512];
    const char *argv[256];
} proc_bufs;

/* system calls only: the crash prologue writes it too */
static void write_process(proc_bufs *b)
{
    char *buf = b->buf;
    int fd = open("/proc/self/cmdline", O_RDONLY | O_CLOEXEC);
    ssize_t len = fd >= 0 ? read(fd, buf, sizeof b->buf - 1) : -1;
    if (fd >= 0)
        close(fd);
    if (len < 0)
        len = 0;
    buf[len] = 0;
    int argc = 0;
    for (ssize_t i = 0; i < len && argc < 255; i += (ssize_t)strlen(buf + i) + 1)
        b->argv[argc++] = buf + i;
    ssize_t l = readlink("/proc/self/exe", b->exe, sizeof b->exe - 1);
    b->exe[l > 0 ? l : 0] = 0;
    b->argv[argc] = b->exe;
    cs_rec_process p = {.argc = (uint32_t)argc};
    cs_trace_write_strs(CS_REC_PROCESS, &p, sizeof p, b->argv, argc + 1);
}

/* The lifecycle's sink: the history of an object with a finding. Called
 * under the object's stripe lock (lock order: stripe, stack tree, file). */
void cs_runtime_sink(void *ud, const cs_event *ev)
{
    (void)ud;
    cs_stack_ensure(ev->stack);
    cs_trace_write(CS_REC_EVENT, ev, sizeof *ev);
}

void cs_runtime_prologue(void)
{
    char opts[2048];
    proc_bufs b;
    write_process(&b);
    cs_options_format(opts, sizeof opts);
    const char *o[1] = {opts};
    cs_trace_write_strs(CS_REC_OPTIONS, "", 0, o, 1);
    cs_modules_note();
    /* a forked child's file starts with the live objects it inherited */
    if (cs_lc)
        cs_lc_remirror(cs_lc);
}

void cs_runtime_crash_prologue(void)
{
    /* static: a crash handler may run on a small alternate stack */
    static char opts[2048];
    static proc_bufs b;
    write_process(&b);
    cs_options_format(opts, sizeof opts);
    const char *o[1] = {opts};
    cs_trace_write_strs(CS_REC_OPTIONS, "", 0, o, 1);
    cs_modules_note_all();
}

void cs_runtime_begin(int api) { atomic_store(&started, 1), api_mode = api; }
int cs_runtime_running(void) { return atomic_load(&started) && !atomic_load(&finished); }
int cs_runtime_end_once(void) { return atomic_load(&started) && !atomic_exchange(&finished, 1); }
int cs_runtime_api_mode(void) { return api_mode; }

void cs_runtime_fork_child(void)
{
    atomic_store(&next_counts, 0);
    atomic_store(&first_counts, 0);
}
