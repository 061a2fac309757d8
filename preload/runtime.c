/* The runtime's hub (see runtime.h): start-up, the emit path, and the
 * process-level hooks that keep tracing right across dlopen, fork, exit and
 * crashes. */
#include "runtime.h"

#include <dlfcn.h>
#include <fcntl.h>
#include <link.h>
#include <pthread.h>
#include <signal.h>
#include <spawn.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <ucontext.h>
#include <unistd.h>

#include "capsan.h"
#include "capsule.h"
#include "dataguard.h"
#include "got.h"
#include "modules.h"
#include "numpy.h"
#include "roots.h"
#include "options.h"
#include "probe.h"
#include "livestate.h"
#include "reach.h"
#include "unwfd.h"
#include "deleter.h"
#include "xapi.h"
#include "pyapi.h"
#include "spin.h"
#include "stack.h"
#include "tracefile.h"

extern char **environ;

cs_lifecycle *cs_lc;
volatile int cs_recording;
static atomic_int started, finished;
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
    return ev->kind >= CS_EV_NP_ALLOC ? CS_NS_NUMPY : CS_NS_DLPACK;
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
    if (t->importing || (want_stack && ev->kind == CS_EV_NP_ALLOC && cs_stack_importing(t, gil)))
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
    uintptr_t key = (uintptr_t)site ^ (uintptr_t)what;
    int fresh = 1;
    cs_spin_lock(&nogil_mu);
    for (size_t i = (key >> 4) % NOGIL_SITES, n = 0; n < NOGIL_SITES; i = (i + 1) % NOGIL_SITES, n++) {
        if (nogil_sites[i] == key) {
            fresh = 0;
            break;
        }
        if (!nogil_sites[i]) {
            nogil_sites[i] = key;
            break;
        }
    }
    cs_spin_unlock(&nogil_mu);
    if (fresh) {
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
static void sink(void *ud, const cs_event *ev)
{
    (void)ud;
    cs_stack_ensure(ev->stack);
    cs_trace_write(CS_REC_EVENT, ev, sizeof *ev);
}

static void prologue(void)
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

int capsan_scope_dlpack_leaks(uint64_t since_ns)
{
    if (!cs_lc || !cs_recording)
        return 0;
    uint64_t *keys;
    size_t n = cs_lc_consumed_since(cs_lc, since_ns, &keys);
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
            reported += cs_lc_report_dlpack_leak(cs_lc, keys[i]);
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
    if (cs_trace_started()) {
        write_counts(cs_now_ns());
        cs_rec_end e = {.how = (uint32_t)how, .status = final, .time_ns = cs_now_ns(),
                        .events = (cs_lc ? cs_lc_events(cs_lc) : 0)};
        cs_trace_write(CS_REC_END, &e, sizeof e);
    }
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

/* ---- process hooks ---- */

static void after_load(void)
{
    cs_got_scan();
    if (cs_trace_started())
        cs_modules_note();
}

/* glibc searches a bare name in the *caller's* RUNPATH; through this hook
 * the caller would be libcapsan.so, so the caller's search path is
 * replayed here first (memray's dlopen hook does the same). */
static void *dlopen_from(const void *caller, const char *file, int mode)
{
    Dl_info di;
    struct link_map *lm = NULL;
    if (!file || strchr(file, '/') || !dladdr1(caller, &di, (void **)&lm, RTLD_DL_LINKMAP) || !lm)
        return NULL;
    void *h = dlopen(file, mode | RTLD_NOLOAD);
    if (h)
        return h;
    const char *strtab = NULL, *rp = NULL;
    size_t runpath = 0, rpath = 0;
    int has_runpath = 0, has_rpath = 0;
    for (const ElfW(Dyn) *d = lm->l_ld; d && d->d_tag != DT_NULL; d++) {
        if (d->d_tag == DT_STRTAB)
            strtab = (const char *)d->d_un.d_ptr;
        else if (d->d_tag == DT_RUNPATH)
            runpath = d->d_un.d_val, has_runpath = 1;
        else if (d->d_tag == DT_RPATH)
            rpath = d->d_un.d_val, has_rpath = 1;
    }
    if (!strtab || (!has_runpath && !has_rpath))
        return NULL;
    if ((uintptr_t)strtab < lm->l_addr)
        strtab += lm->l_addr;
    rp = strtab + (has_runpath ? runpath : rpath);
    char origin[512];
    const char *objpath = lm->l_name && *lm->l_name ? lm->l_name : di.dli_fname;
    const char *sl = strrchr(objpath, '/');
    snprintf(origin, sizeof origin, "%.*s", sl ? (int)(sl - objpath) : 1, sl ? objpath : ".");
    while (*rp) {
        size_t len = strcspn(rp, ":");
        char dir[1024], path[1400];
        if (len >= 7 && !strncmp(rp, "$ORIGIN", 7))
            snprintf(dir, sizeof dir, "%s%.*s", origin, (int)(len - 7), rp + 7);
        else if (len >= 9 && !strncmp(rp, "${ORIGIN}", 9))
            snprintf(dir, sizeof dir, "%s%.*s", origin, (int)(len - 9), rp + 9);
        else
            snprintf(dir, sizeof dir, "%.*s", (int)len, rp);
        snprintf(path, sizeof path, "%s/%s", dir, file);
        if (access(path, F_OK) == 0 && (h = dlopen(path, mode)))
            return h;
        rp += len;
        if (*rp)
            rp++;
    }
    return NULL;
}

static void *hook_dlopen(const char *file, int mode)
{
    void *h = dlopen_from(__builtin_return_address(0), file, mode);
    if (!h)
        h = dlopen(file, mode);
    if (h)
        after_load();
    return h;
}

static int hook_dlclose(void *h)
{
    int rc = dlclose(h);
    cs_got_forget_unloaded();
    cs_stack_flush();
    cs_np_after_dlclose();
    return rc;
}

/* ctypes (ctypes.pythonapi) finds C functions with dlsym, which no slot
 * patch reaches: hand it capsan's hooks for the names capsan hooks. Only
 * in _ctypes, which never passes RTLD_NEXT (that would need the caller). */
static const cs_hook *all_hooks_p;
static int all_hooks_n;

static void *hook_dlsym(void *handle, const char *name)
{
    void *p = dlsym(handle, name);
    if (p && name && handle != RTLD_NEXT && strncmp(name, "PyCapsule_", 10) == 0)
        for (int i = 0; i < all_hooks_n; i++)
            if (!all_hooks_p[i].only_in && !strcmp(all_hooks_p[i].name, name))
                return all_hooks_p[i].replacement;
    return p;
}

/* The status the program exits with (main's return or exit()'s argument),
 * -1 until known. The leak verdict waits for capsan's own ELF destructor
 * (capsan_fini): C atexit handlers and the destructors of every library
 * loaded after capsan may still release tensors after Py_Finalize. */
static int exit_status = -1;

static void hook_exit(int status)
{
    exit_status = status;
    exit(status);
}

static void hook__exit(int status)
{
    _exit(cs_runtime_finish(CS_END_QUICK_EXIT, status));
}

typedef int (*main_fn)(int, char **, char **);
static main_fn real_main;

static int main_wrap(int argc, char **argv, char **envp)
{
    int rc = real_main(argc, argv, envp);
    exit_status = rc;
    return rc;
}

typedef int (*lsm_fn)(main_fn, int, char **, void (*)(void), void (*)(void), void (*)(void),
                      void *);

/* The program's own main returning is an exit we must see with its status;
 * the executable's call to __libc_start_main happens after our
 * constructor, through a slot we patched. */
static int hook_libc_start_main(main_fn m, int argc, char **argv, void (*init)(void),
                                void (*fini)(void), void (*rtld_fini)(void), void *stack_end)
{
    lsm_fn real = (lsm_fn)dlsym(RTLD_DEFAULT, "__libc_start_main");
    real_main = m;
    return real(main_wrap, argc, argv, init, fini, rtld_fini, stack_end);
}

/* The last of the exit. glibc runs the ELF destructors (_dl_fini) as the
 * last exit handler, and runs the libraries' in link order, so capsan's
 * destructor comes before those of the extensions Python loaded later.
 * It registers one more exit handler: glibc runs a handler registered
 * while the handlers run once _dl_fini has returned, after every atexit
 * handler and every library's destructor. There the process's leaks are
 * judged; when capsan's exitcode must replace the program's status, the
 * process ends there (stdio flushed first, as exit() would). */
extern int __cxa_atexit(void (*fn)(void *), void *arg, void *dso);

static void last_verdict(void *unused)
{
    (void)unused;
    int st = cs_runtime_finish(CS_END_EXIT, exit_status);
    if (st != exit_status) {
        fflush(NULL);
        _exit(st);
    }
}

/* set once the runtime is fully started (a non-Python process, or one
 * capsan stays out of, never arms it) */
static int verdict_armed;

__attribute__((destructor)) static void capsan_fini(void)
{
    if (!verdict_armed || api_mode)
        return;
    /* no DSO handle: no library's __cxa_finalize runs it early */
    if (__cxa_atexit(last_verdict, NULL, NULL) != 0)
        last_verdict(NULL);
}

static const cs_hook process_hooks[] = {
    {"dlopen", (void *)hook_dlopen, NULL},
    {"dlclose", (void *)hook_dlclose, NULL},
    {"exit", (void *)hook_exit, NULL},
    {"_exit", (void *)hook__exit, NULL},
    {"__libc_start_main", (void *)hook_libc_start_main, NULL},
    {"dlsym", (void *)hook_dlsym, "_ctypes"},
};

static cs_hook all_hooks[48];

/* ---- fork ---- */

void cs_findings_reset_child(void);

/* the same order as everywhere else: stripes, stack tree, trace file */
static void fork_prepare(void)
{
    if (cs_lc)
        cs_lc_lock_all(cs_lc);
    cs_stack_fork_lock(1);
    cs_trace_fork_lock(1);
}

static void fork_parent(void)
{
    cs_trace_fork_lock(0);
    cs_stack_fork_lock(0);
    if (cs_lc)
        cs_lc_unlock_all(cs_lc);
}

static void fork_child(void)
{
    cs_trace_fork_lock(0);
    cs_stack_fork_lock(0);
    if (cs_lc) {
        cs_lc_unlock_all(cs_lc);
        cs_lc_fork_child(cs_lc);
        cs_lc_set_born(cs_lc, cs_now_ns());
    }
    atomic_store(&next_counts, 0);
    atomic_store(&first_counts, 0);
    /* the child writes its own log_path.PID, starting with what it
     * inherited; its findings and exit status are its own */
    cs_trace_atfork_child();
    cs_findings_reset_child();
}

/* ---- crashes ---- */

static const int crash_sigs[] = {SIGSEGV, SIGBUS, SIGILL, SIGFPE, SIGABRT};
static struct sigaction old_act[NSIG];

/* A call through a NULL function pointer. If the struct in the first
 * argument register (x86-64: RDI) is a tensor exported with a NULL deleter
 * (or else the last one this thread consumed), this is a consumer calling
 * that deleter: dlpack-null-deleter, recorded and printed before the
 * process dies. The caller's return address is on top of the stack. */
static void null_deleter_call(const ucontext_t *uc)
{
    if (!cs_lc)
        return;
    uint64_t cand[2] = {(uint64_t)uc->uc_mcontext.gregs[REG_RDI],
                        (uint64_t)(uintptr_t)cs_dl_last_null()};
    const uint64_t *sp = (const uint64_t *)(uintptr_t)uc->uc_mcontext.gregs[REG_RSP];
    for (int i = 0; i < 2; i++) {
        cs_event origin;
        int found;
        cs_lc_lock(cs_lc, cand[i]);
        found = cand[i] && cs_lc_origin(cs_lc, CS_NS_DLPACK, cand[i], &origin);
        cs_lc_unlock(cs_lc, cand[i]);
        if (!found || origin.kind != CS_EV_EXPORT || !(origin.flags & CS_EVF_NULL_DELETER))
            continue;
        cs_event ev = {.kind = CS_EV_DELETE, .obj = cand[i], .aux = CS_DELETE_NULL_CALL,
                       .b = cs_probe_read(sp, sizeof *sp) ? *sp : 0};
        /* from a signal handler native unwinding ends at the jump to 0:
         * the Python frames say where the call came from */
        cs_emit(&ev, CS_STACK_PYTHON, NULL, NULL);
        return;
    }
}

static void on_crash(int sig, siginfo_t *si, void *ucv)
{
    static atomic_int once;
    if (!atomic_exchange(&once, 1) && atomic_load(&started) && !atomic_load(&finished)) {
        ucontext_t *uc = ucv;
        uint64_t pc = uc ? (uint64_t)uc->uc_mcontext.gregs[REG_RIP] : 0;
        if (sig == SIGSEGV && pc == 0 && uc && cs_recording)
            null_deleter_call(uc);
        cs_recording = 0;
        if (cs_trace_started()) {
            cs_rec_end e = {.how = CS_END_SIGNAL, .status = sig, .time_ns = cs_now_ns(),
                            .fault_addr = (uint64_t)(uintptr_t)si->si_addr, .pc = pc,
                            .events = (cs_lc ? cs_lc_events(cs_lc) : 0)};
            cs_trace_write(CS_REC_END, &e, sizeof e);
            cs_trace_close();
        }
        dprintf(2, "==%d==capsan: %s at pc 0x%llx (address 0x%llx)%s\n", (int)getpid(),
                strsignal(sig), (unsigned long long)pc,
                (unsigned long long)(uintptr_t)si->si_addr,
                pc == 0 ? ": a call through a NULL function pointer (a NULL deleter?)" : "");
        dprintf(2, "==%d==capsan: %u finding(s) reported before the crash; trace: %s\n",
                (int)getpid(), cs_findings_total(), cs_trace_path());
    }
    sigaction(sig, &old_act[sig], NULL);
    if (si->si_code <= 0) /* sent, not a fault: it will not happen again */
        raise(sig);
}

static void install_crash_handlers(void)
{
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = on_crash;
    sa.sa_flags = SA_SIGINFO | SA_ONSTACK;
    sigemptyset(&sa.sa_mask);
    for (size_t i = 0; i < sizeof crash_sigs / sizeof crash_sigs[0]; i++) {
        struct sigaction cur;
        sigaction(crash_sigs[i], NULL, &cur);
        /* the program's own handler stays in charge */
        if (cur.sa_handler != SIG_DFL)
            continue;
        sigaction(crash_sigs[i], &sa, &old_act[crash_sigs[i]]);
    }
}

/* ---- start and stop ---- */

static void self_marker(void) {}

static int start(int preload)
{
    if (atomic_exchange(&started, 1))
        return cs_recording;
    api_mode = !preload;
    if (getenv("CAPSAN_CHILD"))
        return 0;
    cs_options_defaults();
    char err[2048];
    if (cs_options_parse(getenv("CAPSAN_OPTIONS"), "CAPSAN_OPTIONS", err, sizeof err) != 0)
        dprintf(2, "%s\n", err);
    if (cs_opt.help) {
        dprintf(2, "capsan options (CAPSAN_OPTIONS=key=value:key=value):\n");
        cs_options_help(2);
        _exit(0);
    }
    if (!cs_pyapi_init())
        return 0; /* not a Python process: stay out of the way */
    if (!cs_py.layout && cs_opt.verbosity)
        dprintf(2, "==%d==capsan: CPython %d.%d is not in capsan's table of interpreter "
                   "layouts (preload/pyversions.inc): stacks will be native only\n",
                (int)getpid(), cs_py.major, cs_py.minor);
    Dl_info di;
    if (dladdr((void *)self_marker, &di) && di.dli_fname)
        snprintf(self_path, sizeof self_path, "%s", di.dli_fname);
    cs_lc = cs_lc_create(cs_findings_cb, NULL, 1);
    if (!cs_lc)
        return 0;
    cs_lc_set_protect(cs_lc, cs_opt.protect);
    cs_lc_live_put = cs_live_put; /* crash-safe live state in the trace */
    cs_lc_live_consumed = cs_live_consumed;
    cs_lc_live_drop = cs_live_drop;
    if (!cs_opt.record_all)
        cs_lc_set_sink(cs_lc, sink, NULL);
    cs_findings_init();
    cs_thread_init();
    cs_stack_init((void *)self_marker);
    cs_clock_init();
    cs_trace_init(cs_opt.log_path, prologue);
    int n = 0;
    for (int i = 0; i < cs_capsule_nhooks; i++)
        all_hooks[n++] = cs_capsule_hooks[i];
    if (cs_numpy_init())
        for (int i = 0; i < cs_numpy_nhooks; i++)
            all_hooks[n++] = cs_numpy_hooks[i];
    cs_dg_init();
    if (cs_dg_hooks_ready())
        for (int i = 0; i < cs_dg_nhooks; i++)
            all_hooks[n++] = cs_dg_hooks[i];
    for (size_t i = 0; i < sizeof process_hooks / sizeof process_hooks[0]; i++)
        if (!api_mode || strcmp(process_hooks[i].name, "__libc_start_main") != 0)
            all_hooks[n++] = process_hooks[i];
    for (int i = 0; i < cs_unwfd_nhooks; i++)
        all_hooks[n++] = cs_unwfd_hooks[i];
    all_hooks_p = all_hooks;
    all_hooks_n = n;
    cs_got_init(all_hooks, n, (void *)self_marker);
    pthread_atfork(fork_prepare, fork_parent, fork_child);
    install_crash_handlers();
    verdict_armed = 1;
    cs_recording = 1;
    int patched = cs_got_scan();
    cs_stack_start();
    if (cs_opt.verbosity) {
        unsigned o, s;
        cs_got_stats(&o, &s);
        dprintf(2, "==%d==capsan: started, %d objects scanned, %u patched slots; trace prefix %s\n",
                (int)getpid(), patched, s, cs_opt.log_path);
    }
    return 1;
}

void capsan_stop(void)
{
    cs_recording = 0;
    cs_got_restore();
    cs_xapi_restore();
}

void *capsan_xapi_follow(void *table) { return cs_recording ? cs_xapi_table(table, 1) : table; }
void *capsan_xapi_original(const void *table, int entry) { return cs_xapi_original(table, entry); }

int capsan_start(void) { return start(0); }
int capsan_active(void) { return cs_recording; }
int capsan_preloaded(void) { return atomic_load(&started) && !api_mode; }

__attribute__((constructor)) static void capsan_preload_ctor(void)
{
    /* LD_PRELOAD starts the runtime; `import capsan` calls capsan_start */
    const char *pre = getenv("LD_PRELOAD");
    if (pre && strstr(pre, "libcapsan"))
        start(1);
}
