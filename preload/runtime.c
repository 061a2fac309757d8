/* The service every hook calls (see runtime.h): the one lifecycle, the
 * emit path, the trace's prologue, and the ending (leak verdicts, the
 * exit status). It calls no hook module: start.c starts them and it. */
#include "runtime.h"
#include "arrow.h"

#include <dlfcn.h>
#include <fcntl.h>
#include <pthread.h>
#include <spawn.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "capsan.h"
#include "modules.h"
#include "roots.h"
#include "options.h"
#include "probe.h"
#include "livestate.h"
#include "reach.h"
#include "pyapi.h"
#include "quarantine.h"
#include "seenset.h"
#include "spin.h"
#include "stack.h"
#include "tracefile.h"

extern char **environ;

cs_lifecycle *cs_lc;
volatile int cs_recording;
static atomic_int started, finished; /* cs_runtime_begin, cs_runtime_finish */
/* started by `import capsan` rather than LD_PRELOAD: findings go to the
 * Python API; the exit status and exit-time report stay the program's */
static int api_mode;
static _Atomic uint64_t next_counts; /* when the next COUNTS record is due */

static void write_counts(uint64_t now)
{
    cs_lc_totals t;
    cs_lc_totals_get(cs_lc, &t);
    cs_rec_counts c = {.time_ns = now, .events = (cs_lc ? cs_lc_events(cs_lc) : 0),
                       .live_dlpack = (uint64_t)t.dlpack, .live_dlpack_bytes = (uint64_t)t.dlpack_bytes,
                       .live_numpy = (uint64_t)t.numpy, .live_numpy_bytes = (uint64_t)t.numpy_bytes};
    cs_trace_write(CS_REC_COUNTS, &c, sizeof c);
}

/* COUNTS records, the report's memory plot: one every 10 ms for the
 * first 10 s, then one per thousandth of the time run so far, so a run of
 * hours adds records (and trace pages) at a falling rate: about 2,300 per
 * tenfold of run time (6,000 in a first hour), not 360,000 an hour. */
static _Atomic uint64_t first_counts;

static void maybe_counts(uint64_t now)
{
    uint64_t due = atomic_load_explicit(&next_counts, memory_order_relaxed);
    if (now < due)
        return;
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
    write_counts(now);
}

/* ---- emit ---- */

static int ns_of(const cs_event *ev)
{
    return CS_EV_IS_NUMPY(ev->kind)   ? CS_NS_NUMPY
           : CS_EV_IS_ARROW(ev->kind) ? CS_NS_ARROW
                                      : CS_NS_DLPACK;
}

static void halt(void);

unsigned cs_emit(cs_event *ev, int want_stack, cs_event *origin, int *found)
{
    cs_thread *t = cs_thread_get();
    if (found)
        *found = 0;
    if (!t || t->busy || !cs_recording || !cs_lc) {
        /* not recording (or capsan's own call): still answer the lookup
         * a trampoline needs to forward its call */
        if (origin && cs_lc) {
            cs_lc_lock(cs_lc, ev->obj);
            *found = cs_lc_origin(cs_lc, ns_of(ev), ev->obj, origin);
            if (*found && cs_lc_state(cs_lc, ns_of(ev), ev->obj) == CS_ST_RELEASED)
                *found = 2; /* as cs_lc_judge says it */
            cs_lc_unlock(cs_lc, ev->obj);
        }
        return 0;
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
    if (gil)
        ev->flags |= CS_EVF_GIL;
    if (!live)
        ev->flags |= CS_EVF_NO_PYTHON;
    t->importing = t->py_walked = 0;
    if (want_stack && (cs_opt.native_depth > 0 || cs_opt.python_depth > 0))
        ev->stack = cs_stack_capture(t, gil, want_stack == CS_STACK_PYTHON, ev->kind);
    else if (ev->stack)
        cs_stack_ensure(ev->stack);
    /* a NumPy block made by an import is module data; the frames the stack
     * did not record (all of them with Python stacks off) may show one.
     * The flag matters for NumPy blocks only: no other event walks them */
    if (t->importing || (want_stack && ev->kind == CS_EV_NP_ALLOC &&
                         (!t->py_walked || t->py_rest) && cs_stack_importing(t, gil)))
        ev->flags |= CS_EVF_IMPORT;
    cs_lc_lock(cs_lc, ev->obj);
    ev->time_ns = cs_now_ns();
    unsigned v = cs_lc_judge(cs_lc, ev, origin, found);
    if ((v & CS_VERDICT_SKIP) && cs_opt.protect) {
        ev->flags |= CS_EVF_SKIPPED; /* the lifecycle marked its own copies */
    } else {
        v &= ~CS_VERDICT_SKIP;
    }
    if (cs_opt.record_all)
        cs_trace_write(CS_REC_EVENT, ev, sizeof *ev);
    cs_lc_unlock(cs_lc, ev->obj);
    maybe_counts(ev->time_ns);
    cs_findings_flush();
    t->busy = 0;
    if (cs_opt.halt_on_error && cs_findings_errors())
        halt();
    return v;
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
        cs_event ev = {.kind = CS_EV_NO_GIL, .obj = (uint64_t)(uintptr_t)site,
                       .aux = (uint16_t)what, .flags = CS_EVF_GIL_KNOWN};
        cs_emit(&ev, 1, NULL, NULL);
    }
    return CS_EVF_GIL_KNOWN;
}

/* ---- the trace prologue: who we are, what is loaded, what a forked
 * child inherited ---- */

static void write_process(void)
{
    char buf[8192];
    int fd = open("/proc/self/cmdline", O_RDONLY | O_CLOEXEC);
    ssize_t len = fd >= 0 ? read(fd, buf, sizeof buf - 1) : -1;
    if (fd >= 0)
        close(fd);
    if (len < 0)
        len = 0;
    buf[len] = 0;
    const char *argv[256];
    int argc = 0;
    for (ssize_t i = 0; i < len && argc < 255; i += (ssize_t)strlen(buf + i) + 1)
        argv[argc++] = buf + i;
    char exe[512];
    ssize_t l = readlink("/proc/self/exe", exe, sizeof exe - 1);
    exe[l > 0 ? l : 0] = 0;
    argv[argc] = exe;
    cs_rec_process p = {.argc = (uint32_t)argc};
    cs_trace_write_strs(CS_REC_PROCESS, &p, sizeof p, argv, argc + 1);
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
    write_process();
    cs_options_format(opts, sizeof opts);
    const char *o[1] = {opts};
    cs_trace_write_strs(CS_REC_OPTIONS, "", 0, o, 1);
    cs_modules_note();
    /* a forked child's file starts with the live objects it inherited */
    if (cs_lc)
        cs_lc_remirror(cs_lc);
}

/* ---- finishing ---- */

static char self_path[512];

/* report=json: the report tool renders the finished trace next to it. */
static void json_report(void)
{
    const char *tp = cs_trace_path();
    if (!*tp)
        return; /* no trace: the findings went to stderr as text (findings.c) */
    char bin[600], out[700];
    const char *slash = strrchr(self_path, '/');
    int dir = slash ? (int)(slash - self_path) : 0;
    snprintf(bin, sizeof bin, "%.*s/../bin/capsan", dir, self_path);
    snprintf(out, sizeof out, "%s.json", tp);
    char *argv[] = {bin, "report", "--format", "json", "-o", out, (char *)tp, NULL};
    /* the child must not trace itself */
    char *env[] = {"CAPSAN_CHILD=1", NULL};
    pid_t pid;
    int st = -1;
    if (posix_spawn(&pid, bin, NULL, NULL, argv, env) == 0 && waitpid(pid, &st, 0) == pid &&
        WIFEXITED(st) && WEXITSTATUS(st) == 0)
        dprintf(2, "==%d==capsan: JSON report written to %s\n", (int)getpid(), out);
    else
        dprintf(2, "==%d==capsan: could not write the JSON report %s; the findings are in "
                "the trace (capsan report --format json %s)\n", (int)getpid(), out, tp);
}

static void note_reachable(void *ud, uint64_t key, uint64_t where, uint64_t base,
                           unsigned region)
{
    (void)ud;
    cs_event ev = {.kind = CS_EV_NP_REACHABLE, .aux = (uint16_t)region, .obj = key, .a = where,
                   .b = base};
    cs_emit(&ev, 0, NULL, NULL);
}

/* at _exit: a tensor or block whose address is stored somewhere */
static void note_reachable_any(void *ud, uint64_t key, uint64_t where, uint64_t base,
                               unsigned region)
{
    note_reachable(ud, key, where, base, region);
    cs_event ev = {.kind = CS_EV_REACHABLE, .aux = (uint16_t)region, .obj = key, .a = where};
    cs_emit(&ev, 0, NULL, NULL);
}

/* at exit: a live Arrow struct that still holds its record somewhere */
static void note_arrow_reachable(void *ud, uint64_t key, uint64_t where, uint64_t base,
                                 unsigned region)
{
    (void)ud, (void)base;
    cs_event ev = {.kind = CS_EV_AR_REACHABLE, .aux = (uint16_t)region, .obj = key, .a = where};
    cs_emit(&ev, 0, NULL, NULL);
}

static int scan_process(const uint64_t *keys, size_t n, const void *also, size_t also_n,
                        cs_root_cb cb, void *ud);

/* Arrow structs moved out and never released: those whose copy is still
 * stored somewhere are held, not leaked (every copy carries its record) */
static void scan_arrow_at_end(void)
{
    uint64_t *keys;
    size_t n = cs_lc_live_keys(cs_lc, CS_NS_ARROW, &keys);
    if (n)
        scan_process(keys, n, NULL, 0, note_arrow_reachable, NULL);
    free(keys);
}

/* ---- API mode: a scope's unreleased tensors ---- */

uint64_t capsan_now_ns(void) { return cs_now_ns(); }

/* One reachability scan of the process for the sorted keys (reach.c),
 * capsan's own memory left out: its tables, its findings, and `also`
 * (n bytes). -1 when out of memory (nothing scanned). */
static int scan_process(const uint64_t *keys, size_t n, const void *also, size_t also_n,
                        cs_root_cb cb, void *ud)
{
    cs_reach *r = cs_reach_new(keys, n);
    if (!r)
        return -1;
    cs_reach_own(r, also, also_n);
    cs_lc_own_memory(cs_lc, cs_reach_own, r);
    cs_findings_own_memory(cs_reach_own, r);
    cs_qr_own_memory(cs_reach_own, r); /* freed blocks, their free deferred */
    cs_ar_own_memory(cs_reach_own, r);
    cs_reach_run(r, cb, ud);
    return 0;
}

typedef struct found_keys {
    const uint64_t *keys;
    size_t n;
    unsigned char *found;
} found_keys;

static void note_found(void *ud, uint64_t key, uint64_t where, uint64_t base, unsigned region)
{
    (void)where;
    (void)base;
    (void)region;
    found_keys *f = ud;
    long i = cs_key_index(f->keys, f->n, key);
    if (i >= 0)
        f->found[i] = 1;
}

static int scope_leaks(uint64_t since_ns, int arrow);

/* the tensors, then the Arrow structs, of the scope */
int capsan_scope_dlpack_leaks(uint64_t since_ns)
{
    if (!cs_lc || !cs_recording)
        return 0;
    return scope_leaks(since_ns, 0) + scope_leaks(since_ns, 1);
}

static int scope_leaks(uint64_t since_ns, int arrow)
{
    uint64_t *keys;
    size_t n = arrow ? cs_lc_arrow_moved_since(cs_lc, since_ns, &keys)
                     : cs_lc_consumed_since(cs_lc, since_ns, &keys);
    if (!n)
        return 0;
    /* most tensors a scope consumed are released by its end: only the
     * rest costs a scan */
    found_keys f = {keys, n, calloc(n, 1)};
    int reported = 0;
    if (f.found && scan_process(keys, n, f.found, n, note_found, &f) == 0) {
        cs_thread *t = cs_thread_get();
        for (size_t i = 0; i < n; i++) {
            if (f.found[i])
                continue; /* still referenced: the program may release it later */
            if (t)
                t->busy = 1; /* the report's own allocations are not events */
            reported += arrow ? cs_lc_report_arrow_leak(cs_lc, keys[i])
                              : cs_lc_report_dlpack_leak(cs_lc, keys[i]);
            if (t)
                t->busy = 0;
        }
        cs_findings_flush();
    }
    memset(keys, 0, n * sizeof *keys);
    free(keys);
    free(f.found);
    return reported;
}

int cs_runtime_api_mode(void) { return api_mode; }

/* _exit(): no finalization ran, so whatever is alive may still be in use.
 * What no word of the process's memory points to any more is leaked
 * (reach.c); the rest is live at _exit. */
static void scan_at_quick_exit(void)
{
    uint64_t *np, *dl;
    size_t nn = cs_lc_live_keys(cs_lc, CS_NS_NUMPY, &np);
    size_t nd = cs_lc_live_keys(cs_lc, CS_NS_DLPACK, &dl);
    uint64_t *keys = nn + nd ? malloc((nn + nd) * sizeof *keys) : NULL;
    if (keys) {
        /* one sorted list (both are sorted): one pass over memory */
        size_t i = 0, j = 0, k = 0;
        while (i < nn || j < nd) {
            uint64_t v = (j >= nd || (i < nn && np[i] <= dl[j])) ? np[i++] : dl[j++];
            if (!k || keys[k - 1] != v)
                keys[k++] = v;
        }
        /* freed memory keeps its bytes: a stale copy of a key is a root */
        memset(np, 0, nn * sizeof *np);
        memset(dl, 0, nd * sizeof *dl);
        free(np);
        free(dl);
        np = dl = NULL;
        scan_process(keys, k, NULL, 0, note_reachable_any, NULL);
    }
    free(np);
    free(dl);
    free(keys);
}

int cs_runtime_finish(int how, int status)
{
    if (!atomic_load(&started) || atomic_exchange(&finished, 1))
        return status;
    if (how == CS_END_EXIT && !api_mode && cs_lc) {
        /* NumPy blocks a module's static data still holds are not leaks */
        uint64_t *keys;
        size_t n = cs_lc_live_keys(cs_lc, CS_NS_NUMPY, &keys);
        if (n)
            cs_roots_scan(keys, n, note_reachable, NULL);
        free(keys);
    }
    if ((how == CS_END_EXIT || how == CS_END_QUICK_EXIT) && !api_mode && cs_lc)
        scan_arrow_at_end();
    if (how == CS_END_QUICK_EXIT && !api_mode && cs_lc)
        scan_at_quick_exit();
    cs_thread *t = cs_thread_get();
    if (t)
        t->busy = 1;
    cs_recording = 0;
    if ((how == CS_END_EXIT || how == CS_END_QUICK_EXIT) && !api_mode) {
        cs_lc_finish(cs_lc, how);
        cs_findings_flush_exit();
    }
    /* the status the process really exits with: capsan's exitcode when it
     * found errors (LeakSanitizer's convention), else the program's */
    int final = (!api_mode && cs_findings_errors() && cs_opt.exitcode) ? (int)cs_opt.exitcode
                                                                         : status;
    cs_lc_totals tot = {0};
    if (cs_lc)
        cs_lc_totals_get(cs_lc, &tot);
    uint64_t events = cs_lc ? cs_lc_events(cs_lc) : 0;
    if (cs_trace_started()) {
        write_counts(cs_now_ns());
        cs_rec_end e = {.how = (uint32_t)how, .status = final, .time_ns = cs_now_ns(),
                        .events = events, .tensors = (uint64_t)tot.born_dlpack,
                        .blocks = (uint64_t)tot.born_numpy, .findings = cs_findings_total(),
                        .arrow = (uint64_t)tot.born_arrow};
        cs_trace_write(CS_REC_END, &e, sizeof e);
    }
    if (!api_mode && cs_opt.verbosity && !cs_findings_total())
        /* a clean run says what it watched (capsan run says it for all
         * its processes; a bare LD_PRELOAD is silent unless asked) */
        dprintf(2, "==%d==capsan: no findings: %lld tensor(s), %lld NumPy block(s) and %lld "
                   "Arrow struct(s) watched (%llu events)\n", (int)getpid(),
                (long long)tot.born_dlpack, (long long)tot.born_numpy, (long long)tot.born_arrow,
                (unsigned long long)events);
    if (!api_mode) {
        cs_findings_summary();
        if (!strcmp(cs_opt.report, "json") && cs_findings_total())
            json_report();
    }
    cs_trace_close();
    if (t)
        t->busy = 0;
    return final;
}

static void halt(void)
{
    int st = cs_runtime_finish(CS_END_HALT, (int)cs_opt.exitcode);
    _exit(st ? st : 1);
}


void cs_runtime_begin(int api) { atomic_store(&started, 1), api_mode = api; }
int cs_runtime_running(void) { return atomic_load(&started) && !atomic_load(&finished); }

void cs_runtime_set_self(const char *path) { snprintf(self_path, sizeof self_path, "%s", path); }

void cs_runtime_fork_child(void)
{
    atomic_store(&next_counts, 0);
    atomic_store(&first_counts, 0);
}
