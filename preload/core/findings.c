/* Live findings: queued by the lifecycle callback (which runs under a
 * stripe lock) and printed right after, LeakSanitizer style, so a report
 * is on stderr before the bug it describes can crash the process. */
#include <dlfcn.h>
#include <link.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "options.h"
#include "capsan.h"
#include "elfsyms.h"
#include "outsym.h"
#include "json.h"
#include "leakgroups.h"
#include "render.h"
#include "runtime.h"
#include "stack.h"
#include "suppress.h"
#include "tracefile.h"
#include "growclean.h"
#include "alloc.h"

/* initial-exec: the default model would call __tls_get_addr per event */
static __thread cs_finding *pending __attribute__((tls_model("initial-exec")));
__thread unsigned cs_findings_npending __attribute__((tls_model("initial-exec")));
static __thread unsigned cappending __attribute__((tls_model("initial-exec")));
static pthread_mutex_t print_mu = PTHREAD_MUTEX_INITIALIZER;
static cs_summary summary;
static _Atomic unsigned n_errors, n_total;
static unsigned printed;
static cs_suppressions *supp;
/* every reported finding, for the Python API (capsan_findings_json) */
#define LOG_MAX 100000
static cs_finding *logbuf;
static unsigned nlog, caplog;

static int api_mode; /* nothing printed live but what may kill the process */

void cs_findings_init(int api)
{
    api_mode = api;
    cs_render_strip_prefix(cs_opt.strip_path_prefix);
    char err[512];
    if (cs_opt.suppressions[0] && !(supp = cs_supp_load(cs_opt.suppressions, err, sizeof err)))
        dprintf(2, "capsan: %s\n", err);
}

void cs_findings_own_memory(void (*fn)(void *ud, const void *p, size_t n), void *ud)
{
    /* another thread's pending buffer is not reached: it is emptied after
     * every event, and only an object with a finding can be in it */
    fn(ud, pending, cappending * sizeof *pending);
    fn(ud, logbuf, caplog * sizeof *logbuf);
}

/* findings judged, suppressed or not */
static _Atomic unsigned n_judged;

void cs_findings_cb(void *ud, const cs_finding *f)
{
    (void)ud;
    atomic_fetch_add_explicit(&n_judged, 1, memory_order_relaxed);
    if (cs_findings_npending == cappending) {
        unsigned ncap = cappending ? cappending * 2 : 4;
        cs_finding *n = cs_grow_clean(pending, cs_findings_npending * sizeof *n, ncap * sizeof *n);
        if (!n)
            return;
        pending = n;
        cappending = ncap;
    }
    pending[cs_findings_npending++] = *f;
}

unsigned cs_findings_errors(void) { return atomic_load(&n_errors); }
unsigned cs_findings_total(void) { return atomic_load(&n_total); }
unsigned cs_findings_judged(void) { return atomic_load_explicit(&n_judged, memory_order_relaxed); }

/* ---- an in-process stack source: function names from each module's
 * symbol table (static functions too: elfsyms.h), else dladdr's; file and
 * line are the report tool's (DWARF) ---- */
static int src_raw(void *ud, uint32_t id, uint64_t *v, int max)
{
    (void)ud;
    return cs_stack_raw(id, v, max);
}

/* The main program's path: dladdr names it as it was run ("python3"),
 * which neither a reader nor a symbolizer can open. */
static char exe_path[4096];
static pthread_once_t exe_once = PTHREAD_ONCE_INIT;

static void read_exe_path(void)
{
    ssize_t n = readlink("/proc/self/exe", exe_path, sizeof exe_path - 1);
    exe_path[n > 0 ? n : 0] = 0;
}

static int src_native(void *ud, uint64_t ip, cs_frame_info *out, int max)
{
    (void)ud;
    (void)max;
    Dl_info di;
    struct link_map *lm = NULL;
    memset(out, 0, sizeof *out);
    out->address = ip;
    if (ip && dladdr1((void *)(uintptr_t)(ip - 1), &di, (void **)&lm, RTLD_DL_LINKMAP)) {
        out->module = di.dli_fname;
        if (lm && !lm->l_name[0]) {
            pthread_once(&exe_once, read_exe_path);
            if (exe_path[0])
                out->module = exe_path;
        }
        /* relative to the load bias, as the offline report and addr2line */
        out->offset = ip - (lm ? (uint64_t)lm->l_addr : (uint64_t)(uintptr_t)di.dli_fbase);
        /* ip - 1: the call, not what follows it (the callee may be noreturn) */
        const char *name =
            lm ? cs_elfsyms_name(lm->l_name, lm->l_addr, out->offset - 1, &out->build_id) : NULL;
        out->function = name ? name : di.dli_sname;
    }
    return 1;
}

static int src_code(void *ud, uint32_t id, const char **file, const char **name)
{
    (void)ud;
    return cs_stack_code(id, file, name);
}

static const cs_stack_source live_src = {NULL, src_raw, src_native, src_code};

/* ---- suppressions: the report's names, so that a file gives the same
 * result live as in `capsan report` ---- */

/* a first pass that only collects the native addresses to symbolize */
static int want_native(void *ud, uint64_t ip, cs_frame_info *out, int max)
{
    int n = src_native(NULL, ip, out, max);
    cs_outsym_want(ud, ip, out->module, out->offset);
    return n;
}

static int sym_native(void *ud, uint64_t ip, cs_frame_info *out, int max)
{
    int n = cs_outsym_frames(ud, ip, out, max);
    return n ? n : src_native(NULL, ip, out, max);
}

/* the display key of a leak's first stack (leakgroups.h) */
static uint64_t first_key(const cs_finding *f)
{
    return f->nevents ? cs_stack_display_key(&live_src, f->events[0].stack) : 0;
}

/* sup[i] = pending[i] is suppressed. A rule that names a source file or
 * an inlined function matches only with the report's DWARF names: those
 * are asked of `capsan symbolize`, once for every finding the runtime's
 * own names left unmatched (outsym.h). */
static void suppressed(const cs_finding *fs, unsigned n, unsigned char *sup)
{
    unsigned left = 0;
    for (unsigned i = 0; i < n; i++)
        left += !(sup[i] = (unsigned char)cs_supp_match(supp, &fs[i], &live_src));
    cs_outsym *os = left ? cs_outsym_new() : NULL;
    if (!os)
        return;
    cs_stack_source want = {os, src_raw, want_native, src_code};
    for (unsigned i = 0; i < n; i++) {
        int nev = fs[i].nevents < CS_FINDING_MAX_EVENTS ? fs[i].nevents : CS_FINDING_MAX_EVENTS;
        for (int e = 0; !sup[i] && e < nev; e++) {
            cs_frame_info frames[64];
            cs_stack_frames(&want, fs[i].events[e].stack, frames, 64);
        }
    }
    cs_stack_source sym = {os, src_raw, sym_native, src_code};
    if (cs_outsym_run(os) == 0)
        for (unsigned i = 0; i < n; i++)
            if (!sup[i])
                sup[i] = (unsigned char)cs_supp_match(supp, &fs[i], &sym);
    cs_outsym_free(os);
}

static void out_fd(void *ud, const char *s, size_t n)
{
    (void)ud;
    while (n) {
        ssize_t w = write(2, s, n);
        if (w <= 0)
            return;
        s += w;
        n -= (size_t)w;
    }
}

static cs_proc_info proc_info(void)
{
    cs_proc_info p = {.pid = (uint64_t)getpid(), .ppid = (uint64_t)getppid()};
    return p;
}

static int is_leak(const cs_finding *f)
{
    return cs_kind_is_grouped(f->kind);
}

static int may_print(void)
{
    /* max_findings=0 shows them all, as LeakSanitizer's max_leaks */
    return cs_opt.max_findings <= 0 || printed < (unsigned)cs_opt.max_findings;
}

/* A finding about a call capsan lets run that is likely to kill the
 * process (glibc aborts on a double or invalid free, a NULL deleter jumps
 * to 0): said at once even in API mode, where nothing else is printed
 * live, since the process may not live to report it. */
static int about_to_crash(const cs_finding *f)
{
    switch (f->kind) {
    case CS_KIND_NUMPY_DOUBLE_FREE:
    case CS_KIND_NUMPY_FOREIGN_FREE:
    case CS_KIND_DLPACK_NULL_DELETER:
        return 1;
    case CS_KIND_DLPACK_DOUBLE_DELETE:
        return f->nevents && !(f->events[f->nevents - 1].flags & CS_EVF_SKIPPED);
    }
    return 0;
}

/* Findings go to stderr as text: report=text, or report=json without a
 * trace file to render the JSON from (said once, then the text follows). */
static int text_out(void)
{
    static int said;
    if (!strcmp(cs_opt.report, "text"))
        return 1;
    if (strcmp(cs_opt.report, "json") || cs_trace_started())
        return 0;
    if (!said) {
        said = 1;
        dprintf(2, "==%d==capsan: report=json needs the trace file, which could not be "
                "written: findings are reported here as text\n", (int)getpid());
    }
    return 1;
}

/* A debugger's breakpoint before each error finding's report, as ASan's
 * __asan_report_error: `break __capsan_report_error` (exported, never
 * inlined, does nothing) */
__attribute__((noinline, visibility("default"))) void __capsan_report_error(void)
{
    __asm__ volatile("" ::: "memory");
}

/* Print and count what the lifecycle found. At exit (`grouped`), leaks are
 * grouped by where they were made, as LeakSanitizer prints them. */
static void flush(int grouped)
{
    if (!cs_findings_npending)
        return;
    int text = text_out();
    cs_out o = {out_fd, NULL, text && isatty(2)};
    cs_proc_info p = proc_info();
    cs_leak_groups groups = {0};
    pthread_mutex_lock(&print_mu);
    unsigned char *sup = supp ? cs_calloc(cs_findings_npending, 1) : NULL;
    if (sup)
        suppressed(pending, cs_findings_npending, sup);
    for (unsigned i = 0; i < cs_findings_npending; i++) {
        if (supp && (sup ? sup[i] : cs_supp_match(supp, &pending[i], &live_src))) {
            summary.suppressed++;
            continue;
        }
        atomic_fetch_add(&n_total, 1);
        if (cs_finding_severity(&pending[i]) == CS_SEV_ERROR) {
            atomic_fetch_add(&n_errors, 1);
            __capsan_report_error();
        }
        cs_summary_add(&summary, &pending[i]);
        cs_summary_locate(&summary, &pending[i], &live_src);
        if (nlog == caplog && caplog < LOG_MAX) {
            unsigned nc = caplog ? caplog * 2 : 64;
            cs_finding *nb = cs_grow_clean(logbuf, nlog * sizeof *nb, nc * sizeof *nb);
            if (nb) {
                logbuf = nb;
                caplog = nc;
            }
        }
        if (nlog < caplog)
            logbuf[nlog++] = pending[i];
        /* API mode prints nothing live: the scope and the pytest plugin say it */
        if (!text || (api_mode && !about_to_crash(&pending[i])))
            continue;
        if (grouped && is_leak(&pending[i]) && cs_lg_add(&groups, &pending[i],
                                                                   first_key(&pending[i])) == 0)
            continue;
        if (may_print()) {
            cs_render_text_finding(&o, &p, &pending[i], &live_src);
            printed++;
        }
    }
    const cs_leak_group **v;
    size_t n = cs_lg_sorted(&groups, &v);
    for (size_t i = 0; i < n; i++) {
        if (!may_print())
            continue;
        cs_render_text_leak_group(&o, &p, v[i], &live_src);
        printed += v[i]->count;
    }
    cs_free(v);
    cs_lg_free(&groups);
    cs_free(sup);
    pthread_mutex_unlock(&print_mu);
    cs_findings_npending = 0;
}

void cs_findings_flush_pending(void) { flush(0); }
void cs_findings_flush_exit(void) { flush(1); }

void cs_findings_summary(void)
{
    if ((!atomic_load(&n_total) && !summary.suppressed) || !text_out())
        return;
    cs_out o = {out_fd, NULL, isatty(2)};
    cs_proc_info p = proc_info();
    pthread_mutex_lock(&print_mu);
    if (cs_opt.max_findings > 0 && printed < summary.errors + summary.warnings)
        cs_outf(&o, "==%d==capsan: %u more finding(s) not shown (max_findings=%ld)\n",
                (int)p.pid, summary.errors + summary.warnings - printed, cs_opt.max_findings);
    const char *tp = cs_trace_path();
    if (*tp)
        cs_outf(&o, "==%d==capsan: trace written to %s (capsan report %s)\n", (int)p.pid, tp, tp);
    if (supp)
        cs_supp_render_used(supp, &o);
    cs_render_text_summary(&o, &p, &summary);
    pthread_mutex_unlock(&print_mu);
}

unsigned cs_findings_crash_list(unsigned max, void (*fn)(void *ud, const cs_finding *f), void *ud)
{
    /* a crash while this thread or another prints: the count will do */
    if (pthread_mutex_trylock(&print_mu) != 0)
        return 0;
    /* a forked child's log starts with its parent's: its count is its own */
    unsigned total = atomic_load(&n_total), k = total < nlog ? total : nlog;
    if (k > max)
        k = max;
    for (unsigned i = nlog - k; i < nlog; i++)
        fn(ud, &logbuf[i]);
    pthread_mutex_unlock(&print_mu);
    return k;
}

void cs_findings_reset_child(void)
{
    memset(&summary, 0, sizeof summary);
    atomic_store(&n_errors, 0);
    atomic_store(&n_total, 0);
    printed = 0;
    pthread_mutex_init(&print_mu, NULL);
    cs_elfsyms_fork_child();
}

/* ---- the Python API's view ---- */

uint64_t capsan_findings_count(void)
{
    pthread_mutex_lock(&print_mu);
    uint64_t n = nlog;
    pthread_mutex_unlock(&print_mu);
    return n;
}

typedef struct membuf {
    char *p;
    size_t n, cap;
    int failed;
} membuf;

static void out_mem(void *ud, const char *s, size_t n)
{
    membuf *m = ud;
    if (m->failed)
        return;
    if (m->n + n + 1 > m->cap) {
        size_t nc = m->cap ? m->cap * 2 : 4096;
        while (nc < m->n + n + 1)
            nc *= 2;
        char *np = cs_realloc(m->p, nc);
        if (!np) {
            m->failed = 1;
            return;
        }
        m->p = np;
        m->cap = nc;
    }
    memcpy(m->p + m->n, s, n);
    m->n += n;
    m->p[m->n] = 0;
}

char *capsan_findings_json(uint64_t since)
{
    membuf m = {0};
    cs_out o = {out_mem, &m, 0};
    cs_json j = {.o = &o};
    cs_proc_info p = proc_info();
    out_mem(&m, "[", 1);
    pthread_mutex_lock(&print_mu);
    for (uint64_t i = since; i < nlog; i++)
        cs_json_finding(&j, &p, &logbuf[i], &live_src);
    pthread_mutex_unlock(&print_mu);
    out_mem(&m, "]", 1);
    if (m.failed) {
        cs_free(m.p);
        return NULL;
    }
    return m.p;
}

void capsan_free(void *p) { cs_free(p); }
