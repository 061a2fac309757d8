/* The process's ending and a scope's (see ending.h): the reachability
 * scans at exit, at _exit and at the end of a capsan.trace() scope, the
 * exit-time leak verdict, the END record, the summary, report=json and
 * halt_on_error. It calls the runtime service and the modules whose
 * memory a scan leaves out; start.c calls it. */
#include "ending.h"

#include <spawn.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "capsan.h"
#include "exitroots.h"
#include "options.h"
#include "roots.h"
#include "runtime.h"
#include "scan.h"
#include "tracefile.h"
#include "xffi.h"
#include "young.h"
#include "growclean.h"
#include "libpath.h"
#include "alloc.h"

static atomic_int stopped; /* cs_ending_stopped: capsan.stop() was called */

/* report=json: the report tool renders the finished trace next to it. */
static void json_report(void)
{
    const char *tp = cs_trace_path();
    if (!*tp)
        return; /* no trace: the findings went to stderr as text (findings.c) */
    char out[700];
    char *bin = (char *)cs_cli_path();
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

/* Arrow structs moved out and never released: those whose copy is still
 * stored somewhere are held, not leaked (every copy carries its record) */
static void scan_arrow_at_end(int how)
{
    uint64_t *keys;
    /* at _exit, what a forked child inherited is not judged: not looked for */
    size_t n = how == CS_END_QUICK_EXIT ? cs_lc_quick_exit_candidates(cs_lc, CS_NS_ARROW, &keys)
                                        : cs_lc_live_keys(cs_lc, CS_NS_ARROW, &keys);
    if (n)
        cs_scan_process(keys, n, NULL, 0, note_arrow_reachable, NULL);
    cs_free_clean(keys, n * sizeof *keys);
}

/* ---- API mode: a scope's unreleased tensors ---- */

uint64_t capsan_now_ns(void) { return cs_now_ns(); }

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

uint64_t capsan_scope_live(uint64_t since_ns)
{
    if (!cs_lc || !cs_recording)
        return 0;
    /* the threads' first: a block moving to the table meanwhile is counted
     * twice, never missed */
    return cs_young_touched_since(since_ns) + cs_lc_touched_since(cs_lc, since_ns);
}

size_t capsan_scope_live_keys(uint64_t since_ns, uint64_t *out, size_t max)
{
    if (!cs_lc || !cs_recording)
        return 0;
    cs_young_flush();
    uint64_t *np, *dl;
    size_t nn = cs_lc_touched_keys(cs_lc, CS_NS_NUMPY, since_ns, &np);
    size_t nd = cs_lc_touched_keys(cs_lc, CS_NS_DLPACK, since_ns, &dl);
    /* one sorted list (both are): a block and a tensor at one address
     * are one address to look for */
    size_t i = 0, j = 0, k = 0;
    uint64_t last = 0;
    while (i < nn || j < nd) {
        uint64_t v = (j >= nd || (i < nn && np[i] <= dl[j])) ? np[i++] : dl[j++];
        if (k && v == last)
            continue;
        if (k < max)
            out[k] = v;
        last = v;
        k++;
    }
    /* freed memory keeps its bytes: a stale key is a root at exit */
    cs_free_clean(np, nn * sizeof *np);
    cs_free_clean(dl, nd * sizeof *dl);
    return k;
}

/* the tensors, then the Arrow structs, of the scope */
int capsan_scope_dlpack_leaks(uint64_t since_ns)
{
    if (!cs_lc || !cs_recording)
        return 0;
    cs_young_flush(); /* a leaked tensor's NumPy blocks are judged with it */
    return scope_leaks(since_ns, 0) + scope_leaks(since_ns, 1);
}

/* The scan reads memory while the program's other threads run (without
 * the GIL, truly at once): a reference one of them holds in a register,
 * or moves meanwhile, can be missed (the 8-thread stress saw a tensor
 * another thread was consuming judged leaked), and so can one in the
 * saved registers of a thread the kernel preempted. While another Python
 * thread lives, what was not found is looked for again after 1, 4 and
 * 16 ms (a time slice or two on a loaded machine): a reference in flight
 * has landed by then; a leaked tensor is still referenced nowhere and is
 * reported as before. Only a scope with an unreleased candidate pays. */
#ifndef SCOPE_RESCANS
#define SCOPE_RESCANS 3
#endif
static void scan_again_while_threads_run(found_keys *f)
{
    for (int round = 0; round < SCOPE_RESCANS; round++) {
        size_t left = 0;
        for (size_t i = 0; i < f->n; i++)
            left += !f->found[i];
        uint32_t other;
        if (!left || !cs_thread_python_left(&other, 1, NULL))
            return;
        struct timespec pause = {0, 1000000L << (2 * round)};
        nanosleep(&pause, NULL);
        if (cs_scan_process(f->keys, f->n, f->found, f->n, note_found, f) != 0)
            return;
    }
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
    found_keys f = {keys, n, cs_calloc(n, 1)};
    int reported = 0;
    if (f.found && cs_scan_process(keys, n, f.found, n, note_found, &f) == 0) {
        cs_thread *t = cs_thread_get();
        scan_again_while_threads_run(&f);
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
    cs_free_clean(keys, n * sizeof *keys);
    cs_free(f.found);
    return reported;
}

/* _exit(): no finalization ran, so whatever is alive may still be in use.
 * What no word of the process's memory points to any more is leaked
 * (reach.c); the rest is live at _exit. */
static void scan_at_quick_exit(void)
{
    uint64_t *np, *dl;
    /* what a forked child inherited is not judged here: not looked for */
    size_t nn = cs_lc_quick_exit_candidates(cs_lc, CS_NS_NUMPY, &np);
    size_t nd = cs_lc_quick_exit_candidates(cs_lc, CS_NS_DLPACK, &dl);
    uint64_t *keys = nn + nd ? cs_malloc((nn + nd) * sizeof *keys) : NULL;
    if (keys) {
        /* one sorted list (both are sorted): one pass over memory */
        size_t i = 0, j = 0, k = 0;
        while (i < nn || j < nd) {
            uint64_t v = (j >= nd || (i < nn && np[i] <= dl[j])) ? np[i++] : dl[j++];
            if (!k || keys[k - 1] != v)
                keys[k++] = v;
        }
        /* freed memory keeps its bytes: a stale copy of a key is a root */
        cs_free_clean(np, nn * sizeof *np);
        cs_free_clean(dl, nd * sizeof *dl);
        np = dl = NULL;
        cs_scan_process(keys, k, NULL, 0, note_reachable_any, NULL);
        cs_free_clean(keys, k * sizeof *keys);
        keys = NULL;
    }
    cs_free(np);
    cs_free(dl);
    cs_free(keys);
}

/* At exit, daemon threads still run (frozen once the interpreter is
 * gone): what a Python thread still alive made or took last may be held
 * by its frames, as LeakSanitizer counts what a live thread's stack
 * reaches. Those are reachable, not leaked. */
static void held_by_running_threads(void)
{
    uint32_t threads[256];
    /* not one that ended its Python part before atexit (join() returned,
     * its pthread is only slower to go) */
    size_t n = cs_thread_python_left(threads, sizeof threads / sizeof threads[0],
                                     cs_exitroots_running);
    if (n > sizeof threads / sizeof threads[0])
        n = sizeof threads / sizeof threads[0];
    static const struct {
        int ns, kind;
    } spaces[] = {{CS_NS_DLPACK, CS_EV_REACHABLE},
                  {CS_NS_NUMPY, CS_EV_NP_REACHABLE},
                  {CS_NS_ARROW, CS_EV_AR_REACHABLE}};
    for (size_t s = 0; n && s < sizeof spaces / sizeof spaces[0]; s++) {
        cs_lc_held *held;
        size_t k = cs_lc_live_held_by(cs_lc, spaces[s].ns, threads, n, &held);
        for (size_t i = 0; i < k; i++) {
            cs_event ev = {.kind = (uint8_t)spaces[s].kind, .aux = CS_WHERE_THREAD,
                           .obj = held[i].key, .b = held[i].thread};
            cs_emit(&ev, 0, NULL, NULL);
        }
        cs_free(held);
    }
    /* blocks and tensors those threads' frames reached at atexit, or a
     * module whose globals were never cleared, or a pyarrow buffer a module
     * reached then (exitroots.c) */
    cs_exit_held *reached;
    size_t k = cs_exitroots_held(&reached);
    for (size_t i = 0; i < k; i++) {
        /* reached at atexit through a capsule that died in finalization,
         * whose deleter then declined: the drop keeps the block (the
         * dropped tensor's indirect part), not a live Python object */
        if (reached[i].region == CS_WHERE_PY_REACHED && reached[i].ns == CS_NS_NUMPY &&
            cs_lc_block_kept_at_shutdown(cs_lc, reached[i].key))
            continue;
        cs_event ev = {.kind = reached[i].ns == CS_NS_NUMPY   ? CS_EV_NP_REACHABLE
                               : reached[i].ns == CS_NS_ARROW ? CS_EV_AR_REACHABLE
                                                              : CS_EV_REACHABLE,
                       .aux = reached[i].region,
                       .obj = reached[i].key, .a = reached[i].where, .b = reached[i].thread};
        cs_emit(&ev, 0, NULL, NULL);
    }
    cs_free(reached);
}

/* keep_trace=findings: a process that ended normally with nothing to say
 * leaves nothing behind, as a sanitizer's log. A halt has a finding; a
 * crash or a kill never comes here, and its trace is its verdict. */
static void remove_clean_trace(int how)
{
    if (strcmp(cs_opt.keep_trace, "findings") != 0 || cs_findings_total() ||
        !(how == CS_END_EXIT || how == CS_END_QUICK_EXIT || how == CS_END_STOPPED_EXIT ||
          how == CS_END_API_EXIT))
        return;
    const char *tp = cs_trace_abs_path(); /* the program may have changed directory */
    if (*tp)
        unlink(tp);
}

void cs_ending_stopped(void) { atomic_store(&stopped, 1); }
int capsan_stopped(void) { return atomic_load(&stopped); }


int cs_ending_finish(int how, int status)
{
    if (!cs_runtime_end_once())
        return status;
    cs_young_flush(); /* judged from here on by the lifecycle alone */
    int api_mode = cs_runtime_api_mode();
    /* no leak verdict at exit in API mode (the scopes judged), nor after
     * capsan.stop() (releases since were not seen): the END says which */
    int exiting = how == CS_END_EXIT || how == CS_END_QUICK_EXIT;
    if (exiting && (api_mode || atomic_load(&stopped)))
        how = api_mode ? CS_END_API_EXIT : CS_END_STOPPED_EXIT;
    /* an FFI error left raised by a call that was its thread's last: the
     * program ends without another call to judge it at (after a stop, a
     * fetch may have gone unseen) */
    if (cs_recording && how != CS_END_STOPPED_EXIT)
        cs_xffi_end();
    if (how == CS_END_EXIT && cs_lc)
        held_by_running_threads();
    if (how == CS_END_EXIT && cs_lc) {
        /* NumPy blocks a module's static data still holds are not leaks */
        uint64_t *keys;
        size_t n = cs_lc_live_keys(cs_lc, CS_NS_NUMPY, &keys);
        if (n)
            cs_roots_scan(keys, n, note_reachable, NULL);
        cs_free_clean(keys, n * sizeof *keys); /* a stale key in freed memory is a root */
    }
    if ((how == CS_END_EXIT || how == CS_END_QUICK_EXIT) && cs_lc)
        scan_arrow_at_end(how);
    if (how == CS_END_QUICK_EXIT && cs_lc)
        scan_at_quick_exit();
    cs_thread *t = cs_thread_get();
    if (t)
        t->busy = 1;
    cs_recording = 0;
    cs_young_flush(); /* what other threads made meanwhile */
    if (how == CS_END_EXIT || how == CS_END_QUICK_EXIT) {
        cs_lc_finish(cs_lc, how);
        cs_findings_flush_exit();
    } else if (how == CS_END_STOPPED_EXIT) {
        cs_findings_flush_exit();
    }
    /* the status the process really exits with: capsan's exitcode when it
     * found errors (LeakSanitizer's convention), else the program's */
    int final = (!api_mode && cs_findings_errors() && cs_opt.exitcode) ? (int)cs_opt.exitcode
                                                                         : status;
    cs_lc_totals tot = {0};
    uint64_t events = 0;
    if (cs_lc)
        cs_lc_tally(cs_lc, &tot, &events);
    if (cs_trace_started()) {
        cs_runtime_write_counts(cs_now_ns());
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
    if (how == CS_END_STOPPED_EXIT && (cs_opt.verbosity || cs_findings_total()))
        dprintf(2, "==%d==capsan: capsan.stop() was called: no leak check at exit (releases "
                   "after the stop were not seen)\n", (int)getpid());
    if (!api_mode) {
        cs_findings_summary();
        if (!strcmp(cs_opt.report, "json") && cs_findings_total())
            json_report();
    }
    cs_trace_close();
    remove_clean_trace(how);
    if (t)
        t->busy = 0;
    return final;
}

void cs_ending_halt(void)
{
    int st = cs_ending_finish(CS_END_HALT, (int)cs_opt.exitcode);
    _exit(st ? st : 1);
}
