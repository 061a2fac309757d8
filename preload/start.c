/* Start-up and the process-level hooks (see runtime.h): the hook table
 * handed to the slot patcher, dlopen/dlclose/dlsym, exit, _exit and main's
 * return, fork, capsan_start() and capsan_stop(). It starts every hook
 * module, the crash handler (crash.c) and the service they all call
 * (runtime.c); nothing calls back into it. */
#include "runtime.h"

#include <dlfcn.h>
#include <link.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "capsan.h"
#include "byaddr.h"
#include "capsule.h"
#include "xffi.h"
#include "crash.h"
#include "dataguard.h"
#include "dataindex.h"
#include "pyalloc.h"
#include "got.h"
#include "livestate.h"
#include "modules.h"
#include "numpy.h"
#include "options.h"
#include "ownheap.h"
#include "ending.h"
#include "exitroots.h"
#include "pyapi.h"
#include "quarantine.h"
#include "stack.h"
#include "tracefile.h"
#include "unwfd.h"
#include "xapi.h"
#include "young.h"

static atomic_int started; /* start() ran (idempotence) */

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
    _exit(cs_ending_finish(CS_END_QUICK_EXIT, status));
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
    int st = cs_ending_finish(CS_END_EXIT, exit_status);
    cs_qr_flush(); /* nothing runs after this handler */
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
    /* API mode has no verdict at exit, but its trace gets its END there
     * too: without one a reader takes the process for killed */
    if (!verdict_armed)
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

static cs_hook all_hooks[128];

/* hooks[0, k) into all_hooks at *n; one that does not fit is left out
 * (said once): its calls then go unseen, nothing is overwritten */
static void add_hooks(int *n, const cs_hook *hooks, int k)
{
    int room = (int)(sizeof all_hooks / sizeof all_hooks[0]) - *n;
    if (k > room) {
        dprintf(2, "capsan: internal: %d hook(s) do not fit the table and are left out\n", k - room);
        k = room;
    }
    for (int i = 0; i < k; i++)
        all_hooks[(*n)++] = hooks[i];
}

/* ---- fork ---- */

void cs_findings_reset_child(void);

/* the same order as everywhere else: stripes, stack tree, trace file */
static void fork_prepare(void)
{
    /* the child starts with every block in the lifecycle, which
     * mirrors them into its own file (cs_lc_fork_child) */
    cs_young_flush();
    cs_young_fork_lock(1);
    if (cs_lc)
        cs_lc_lock_all(cs_lc);
    cs_stack_fork_lock(1);
    cs_trace_fork_lock(1);
    cs_qr_fork_lock(1); /* held for no other lock */
    cs_thread_fork_lock(1); /* nor this one */
    cs_di_fork_lock(1);     /* taken under a tensor's own lock */
    cs_oh_fork_lock(1);     /* innermost: blocks are allocated under the others */
}

static void fork_parent(void)
{
    cs_oh_fork_lock(0);
    cs_di_fork_lock(0);
    cs_thread_fork_lock(0);
    cs_qr_fork_lock(0);
    cs_trace_fork_lock(0);
    cs_stack_fork_lock(0);
    if (cs_lc)
        cs_lc_unlock_all(cs_lc);
    cs_young_fork_lock(0);
}

static void fork_child(void)
{
    cs_oh_fork_lock(0);
    cs_di_fork_lock(0);
    cs_qr_fork_lock(0);
    cs_trace_fork_lock(0);
    cs_stack_fork_lock(0);
    if (cs_lc)
        cs_lc_unlock_all(cs_lc);
    cs_young_fork_lock(0);
    if (cs_lc) {
        cs_lc_fork_child(cs_lc);
        cs_lc_set_born(cs_lc, cs_now_ns());
    }
    cs_runtime_fork_child();
    cs_thread_fork_child(); /* the parent's other threads stay listed */
    /* the child writes its own log_path.PID, starting with what it
     * inherited; its findings and exit status are its own */
    cs_trace_atfork_child();
    cs_findings_reset_child();
}

/* ---- start and stop ---- */

static void self_marker(void) {}

static int start(int preload)
{
    if (atomic_exchange(&started, 1))
        return cs_recording;
    cs_runtime_begin(!preload);
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
        dprintf(2, "==%d==capsan: the layout of CPython %d.%d cannot be proven (%s): stacks "
                   "will be native only, and nothing that needs Python frames is judged\n",
                (int)getpid(), cs_py.major, cs_py.minor, cs_py.layout_why);
    if (cs_py.layout && cs_opt.verbosity >= 2) {
        char row[512];
        cs_pylayout_format(cs_py.layout, row, sizeof row);
        dprintf(2, "==%d==capsan: CPython %d.%d's layout, from %s: %s\n", (int)getpid(),
                cs_py.major, cs_py.minor, cs_py.layout->source, row);
    }
    cs_lc = cs_lc_create(cs_findings_cb, NULL, 1);
    if (!cs_lc)
        return 0;
    cs_lc_set_protect(cs_lc, cs_opt.protect);
    cs_lc_live_put = cs_live_put; /* crash-safe live state in the trace */
    cs_lc_live_consumed = cs_live_consumed;
    cs_lc_live_drop = cs_live_drop;
    cs_young_init(cs_lc); /* NumPy blocks judged on their own thread */
    if (!cs_opt.record_all)
        cs_lc_set_sink(cs_lc, cs_runtime_sink, NULL);
    cs_runtime_halt = cs_ending_halt;
    /* the atexit walk, which tells the threads still running then, armed
     * by any Python program (numpy's import arms it too) */
    cs_runtime_python_thread = cs_exitroots_arm_threads;
    cs_findings_init(cs_runtime_api_mode());
    cs_thread_init();
    cs_stack_init((void *)self_marker);
    cs_clock_init();
    cs_trace_init(cs_opt.log_path, cs_runtime_prologue);
    int n = 0;
    add_hooks(&n, cs_capsule_hooks, cs_capsule_nhooks);
    if (cs_numpy_init())
        add_hooks(&n, cs_numpy_hooks, cs_numpy_nhooks);
    cs_dg_init();
    if (cs_dg_hooks_ready())
        add_hooks(&n, cs_dg_hooks, cs_dg_nhooks);
    if (cs_pyalloc_ready())
        add_hooks(&n, cs_pyalloc_hooks, cs_pyalloc_nhooks);
    for (size_t i = 0; i < sizeof process_hooks / sizeof process_hooks[0]; i++)
        if (preload || strcmp(process_hooks[i].name, "__libc_start_main") != 0)
            add_hooks(&n, &process_hooks[i], 1);
    add_hooks(&n, cs_unwfd_hooks, cs_unwfd_nhooks);
    add_hooks(&n, cs_xffi_hooks, cs_xffi_nhooks);
    add_hooks(&n, cs_ar_addr_hooks, cs_ar_addr_nhooks);
    all_hooks_p = all_hooks;
    all_hooks_n = n;
    cs_got_init(all_hooks, n, (void *)self_marker);
    pthread_atfork(fork_prepare, fork_parent, fork_child);
    cs_crash_init();
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
    if (cs_recording)
        cs_ending_stopped();
    cs_recording = 0;
    cs_got_restore();
    cs_xapi_restore();
}

/* a table a loaded type carries: followed, judged at its first use */
void *capsan_xapi_follow(void *table) { return cs_recording ? cs_xapi_table(table, 0) : table; }
void *capsan_xapi_original(const void *table, int entry) { return cs_xapi_original(table, entry); }

int capsan_start(void) { return start(0); }
int capsan_active(void) { return cs_recording; }
int capsan_preloaded(void) { return atomic_load(&started) && !cs_runtime_api_mode(); }

__attribute__((constructor)) static void capsan_preload_ctor(void)
{
    /* LD_PRELOAD starts the runtime; `import capsan` calls capsan_start */
    const char *pre = getenv("LD_PRELOAD");
    if (pre && strstr(pre, "libcapsan"))
        start(1);
}
