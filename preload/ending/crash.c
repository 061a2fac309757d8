/* Crash signals (see crash.h). Everything from on_crash down runs in a
 * signal handler, maybe on a small alternate stack (faulthandler's), with
 * any lock or the malloc arena possibly held by the code that crashed:
 * system calls, reads through probes, snprintf of strings and integers
 * (glibc formats those on the stack and allocates nothing; the FILE-based
 * printf family locks and allocates, so each line goes out with write()),
 * and buffers that are static, since one thread at a time writes the
 * report. */
#include "crash.h"
#include "crashrec.h"
#include "libpath.h"
#include "signame.h"
#include "tracename.h"

#include <dlfcn.h>
#include <fcntl.h>
#include <limits.h>
#include <link.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/syscall.h> /* SYS_gettid: gettid() is glibc 2.30's, the wheel is for 2.28 */
#include <time.h>
#include <ucontext.h>
#include <unistd.h>

#include "deleter.h"
#include "options.h"
#include "probe.h"
#include "pyapi.h"
#include "runtime.h"
#include "stack.h"
#include "tracefile.h"

/* ---- the stderr the process had when capsan started ----
 * Saved because the program may point fd 2 elsewhere later: pytest's
 * capture dup2s a temporary file over it (dropped when the process dies),
 * a program may send it to a log. LD_PRELOAD starts before main, so that
 * is the stderr the process started with; `import capsan` keeps the one
 * of that moment (the pytest plugin starts the runtime while pytest's
 * capture is suspended, so it is the terminal's there too). The copy is
 * close-on-exec (a program exec'd gets its own), stays open in a forked
 * child (its crash is told where its parent's would be), and is checked
 * before use: a program that closes every descriptor closes it too, and
 * whatever then has its number is written to only if it is the same file. */
static int err_fd = -1;
static dev_t err_dev;
static ino_t err_ino;

static void save_stderr(void)
{
    /* high, away from the small numbers programs dup2 over: the lowest
     * free one from 1000, or half the limit when that is lower. Never near
     * a limit of millions: the kernel grows the table up to the number */
    long from = 1000;
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY &&
        (long)(rl.rlim_cur / 2) < from)
        from = (long)(rl.rlim_cur / 2);
    if (from < 3)
        from = 3;
    int f = fcntl(2, F_DUPFD_CLOEXEC, (int)from);
    if (f < 0)
        f = fcntl(2, F_DUPFD_CLOEXEC, 3); /* every number from `from` up taken */
    struct stat st;
    if (f >= 0 && fstat(f, &st) == 0) {
        err_dev = st.st_dev;
        err_ino = st.st_ino;
        err_fd = f;
    } else if (f >= 0) {
        close(f);
    }
}

/* ---- the report's output: one buffer, written to each target ---- */
static struct {
    int fd[2], nfd;
    size_t n;
    char buf[4096];
} out;

static void out_flush(void)
{
    for (int i = 0; i < out.nfd; i++) {
        const char *p = out.buf;
        size_t n = out.n;
        while (n) {
            ssize_t w = write(out.fd[i], p, n);
            if (w <= 0)
                break; /* nothing more to tell it with */
            p += w;
            n -= (size_t)w;
        }
    }
    out.n = 0;
}

static void out_put(const char *s, size_t n)
{
    while (n) {
        size_t k = sizeof out.buf - out.n < n ? sizeof out.buf - out.n : n;
        memcpy(out.buf + out.n, s, k);
        out.n += k;
        s += k;
        n -= k;
        if (out.n == sizeof out.buf)
            out_flush();
    }
}

static void outf(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void outf(const char *fmt, ...)
{
    static char line[1024];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    if (n > 0)
        out_put(line, (size_t)n < sizeof line ? (size_t)n : sizeof line - 1);
}

static int is_file(int f, dev_t dev, ino_t ino)
{
    struct stat st;
    return f >= 0 && fstat(f, &st) == 0 && st.st_dev == dev && st.st_ino == ino;
}

/* The saved stderr, and fd 2 too when it is another file now: the
 * terminal is where the user looks, and a program that sent its stderr
 * to a log (or pytest's capture file) gets the report there as well,
 * beside its own last words (faulthandler's, say). The same file twice
 * (fd 2 never moved, or moved and back) gets it once. */
static void pick_targets(void)
{
    struct stat st;
    int saved = is_file(err_fd, err_dev, err_ino);
    out.nfd = 0;
    out.n = 0;
    if (saved)
        out.fd[out.nfd++] = err_fd;
    if (fstat(2, &st) == 0 && !(saved && st.st_dev == err_dev && st.st_ino == err_ino))
        out.fd[out.nfd++] = 2;
}

/* ---- the CLI that renders the trace, found at start (libpath.h) ---- */
static const char *cli = "capsan";

/* s as one shell word: quoted when it holds anything but the usual */
static void out_word(const char *s)
{
    const char *p = s;
    while (*p && (strchr("/._-+=:,@%", *p) || (*p >= '0' && *p <= '9') ||
                  ((*p | 32) >= 'a' && (*p | 32) <= 'z')))
        p++;
    if (!*p || strchr(s, '\'')) {
        out_put(s, strlen(s));
        return;
    }
    out_put("'", 1);
    out_put(s, strlen(s));
    out_put("'", 1);
}

/* ---- what crashed ---- */

static int crash_rd(const void *p, void *to, size_t n)
{
    if (!p || !cs_probe_read(p, n))
        return 0;
    memcpy(to, p, n);
    return 1;
}

static const char *code_text(int sig, int code)
{
    switch (code) {
    case SI_USER: return "sent by kill()";
    case SI_TKILL: return "raised by the process itself, by abort() or raise()";
    case SI_QUEUE: return "sent by sigqueue()";
    case SI_KERNEL: return sig == SIGSEGV ? "general protection fault (a non-canonical address?)"
                                          : "sent by the kernel";
    }
    if (code <= 0)
        return "sent";
    switch (sig) {
    case SIGSEGV:
        return code == SEGV_MAPERR ? "address not mapped"
             : code == SEGV_ACCERR ? "access not permitted at that address" : "invalid access";
    case SIGBUS:
        return code == BUS_ADRALN ? "misaligned address"
             : code == BUS_ADRERR ? "no memory behind the address (a truncated mapped file?)"
                                  : "bus error";
    case SIGFPE:
        return code == FPE_INTDIV ? "integer division by zero"
             : code == FPE_INTOVF ? "integer overflow" : "floating-point exception";
    case SIGILL:
        return code == ILL_ILLOPC ? "illegal opcode"
             : code == ILL_PRVOPC ? "privileged opcode" : "illegal instruction";
    }
    return "fault";
}

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

/* The END record; the trace opened now if no record had opened it (a
 * process that crashed before its first event). 0: there is none. */
static int end_trace(int sig, uint64_t pc, uint64_t addr)
{
    if (!cs_trace_started() && !cs_trace_open_crash(cs_runtime_crash_prologue))
        return 0;
    cs_rec_end e = {.how = CS_END_SIGNAL, .status = sig, .time_ns = cs_now_ns(),
                    .fault_addr = addr, .pc = pc, .findings = cs_findings_total()};
    if (cs_lc) {
        cs_lc_totals tot;
        cs_lc_tally(cs_lc, &tot, &e.events);
        e.tensors = (uint64_t)tot.born_dlpack;
        e.blocks = (uint64_t)tot.born_numpy;
        e.arrow = (uint64_t)tot.born_arrow;
    }
    cs_trace_write(CS_REC_END, &e, sizeof e);
    cs_trace_close();
    return 1;
}

static void out_native(int k, uint64_t ip, int exact)
{
    Dl_info di;
    struct link_map *lm = NULL;
    outf("    #%d 0x%llx", k, (unsigned long long)ip);
    /* a return address names the call: look up the byte before it */
    if (ip && dladdr1((void *)(uintptr_t)(ip - !exact), &di, (void **)&lm, RTLD_DL_LINKMAP) &&
        di.dli_fname) {
        const char *base = strrchr(di.dli_fname, '/');
        /* relative to the load bias, as the offline report and addr2line */
        uint64_t off = ip - (lm ? (uint64_t)lm->l_addr : (uint64_t)(uintptr_t)di.dli_fbase);
        if (di.dli_sname)
            outf(" in %s", di.dli_sname);
        outf(" (%s+0x%llx)", base ? base + 1 : di.dli_fname, (unsigned long long)off);
    }
    out_put("\n", 1);
}

static int py_k;

static void out_python(void *ud, const char *file, const char *name, int line)
{
    (void)ud;
    outf("    #%d %s:%d in %s\n", py_k++, file, line, name);
}

static void out_finding(void *ud, const cs_finding *f)
{
    static char msg[1024];
    (void)ud;
    outf("    %s %s: %s\n", cs_finding_severity(f) == CS_SEV_ERROR ? "ERROR" : "WARNING",
         cs_kind_name(f->kind), cs_finding_message(f, msg, sizeof msg));
}

/* The kernel's frame for a signal (x86-64): a return address, its struct
 * ucontext, then the siginfo. Its ucontext is glibc's up to uc_sigmask,
 * which is 8 bytes there (64 signals), 128 in glibc's. */
#define KERNEL_SIGINFO_AT (offsetof(ucontext_t, uc_sigmask) + 8)

/* A handler that ran before capsan's raised sig again (faulthandler hands
 * a fault on so): `k` is the ucontext the kernel saved in that handler's
 * signal frame, the crash itself, if its pc is `next_ip` (the frame the
 * walk found past the trampoline). What the fault was comes from the
 * trap number and fault address saved with it (written for every
 * signal); else from the siginfo, written only for a handler with
 * SA_SIGINFO (faulthandler's has none: the bytes are then stale, hence
 * the checks). *code is left as it was when neither says. */
static int reraised_from(int sig, const char *k, uint64_t next_ip, int *code, uint64_t *pc,
                         uint64_t *addr)
{
    greg_t g[NGREG];
    siginfo_t in;
    if (!crash_rd(k + offsetof(ucontext_t, uc_mcontext.gregs), g, sizeof g) ||
        (uint64_t)g[REG_RIP] != next_ip)
        return 0;
    *pc = (uint64_t)g[REG_RIP];
    *addr = 0;
    /* x86 exceptions: 0 divide error, 6 invalid opcode, 13 general
     * protection, 14 page fault (error bit 0: the page was there), 17
     * alignment check */
    greg_t trap = g[REG_TRAPNO], cr2 = g[REG_CR2];
    if (sig == SIGSEGV && trap == 14)
        *code = (g[REG_ERR] & 1) ? SEGV_ACCERR : SEGV_MAPERR, *addr = (uint64_t)cr2;
    else if (sig == SIGSEGV && trap == 13)
        *code = SI_KERNEL;
    else if (sig == SIGBUS && (trap == 14 || trap == 17))
        *code = trap == 14 ? BUS_ADRERR : BUS_ADRALN, *addr = (uint64_t)cr2;
    else if (sig == SIGFPE && trap == 0)
        *code = FPE_INTDIV, *addr = *pc;
    else if (sig == SIGILL && trap == 6)
        *code = ILL_ILLOPC, *addr = *pc;
    else if (crash_rd(k + KERNEL_SIGINFO_AT, &in, sizeof in) && in.si_signo == sig && !in.si_errno)
        *code = in.si_code, *addr = in.si_code > 0 ? (uint64_t)(uintptr_t)in.si_addr : 0;
    return 1;
}

#define PY_FRAMES 48
#define FINDINGS_LISTED 10

static void report(int sig, const siginfo_t *si, const ucontext_t *uc)
{
    static cs_crash_walk w;
    int pid = (int)getpid(), tid = (int)syscall(SYS_gettid), code = si->si_code;
    int fault = code > 0, first = 0, reraised = 0, traced = 0, walked = 0;
    uint64_t pc = uc ? (uint64_t)uc->uc_mcontext.gregs[REG_RIP] : 0;
    /* si_addr is a fault's address; a signal sent (abort(), kill) has none */
    uint64_t addr = fault ? (uint64_t)(uintptr_t)si->si_addr : 0;
    if (sig == SIGSEGV && pc == 0 && uc && cs_recording)
        null_deleter_call(uc);
    cs_recording = 0;
    /* a fault's END goes first, before the walks; a signal sent may be a
     * fault that a handler ran for before capsan's (faulthandler hands it
     * on so): the walk crosses that handler's signal frame, and the crash
     * is the context the kernel saved there */
    if (fault)
        traced = end_trace(sig, pc, addr);
    if (uc) {
        cs_stack_crash_native(uc, &w);
        walked = 1;
        if (!fault && w.sigframe > 0 && w.sigframe + 1 < w.n &&
            reraised_from(sig, (const char *)(uintptr_t)w.sigframe_sp, w.ip[w.sigframe + 1], &code,
                          &pc, &addr)) {
            reraised = 1;
            first = w.sigframe + 1;
            fault = code > 0;
        }
    }
    if (!traced && !(si->si_code > 0))
        traced = end_trace(sig, pc, addr);

    pick_targets();
    char at[48] = "";
    if (fault)
        snprintf(at, sizeof at, " (address 0x%llx)", (unsigned long long)addr);
    outf("==%d==capsan: %s at pc 0x%llx%s%s\n", pid,
         cs_sig_descr(sig) ? cs_sig_descr(sig) : "signal", (unsigned long long)pc, at,
         pc == 0 ? ": a call through a NULL function pointer (a NULL deleter?)" : "");
    outf("==%d==capsan: SIG%s: %s; thread %d%s%s\n", pid,
         cs_sig_abbrev(sig) ? cs_sig_abbrev(sig) : "?", code_text(sig, code), tid,
         tid == pid ? " (the main thread)" : "",
         reraised ? "; another handler (faulthandler's?) ran first and raised it again" : "");
    out_flush();

    /* native frames down to the eval loop (the Python stack tells the
     * rest, as in capsan's other stacks); written before the Python walk,
     * which a fault could cut short */
    if (walked && w.n > first) {
        int last = w.eval_at >= first ? w.eval_at : w.n - 1;
        outf("==%d==capsan: native stack of the crashing thread:\n", pid);
        for (int i = first; i <= last; i++)
            out_native(i - first, w.ip[i], w.exact[i]);
        if (last < w.n - 1)
            outf("    ... the interpreter's frames below: the Python stack follows\n");
        if (w.in_unwinder)
            outf("    (the crash is in libunwind, capsan's unwinder: not walked)\n");
    } else {
        outf("==%d==capsan: native stack of the crashing thread:\n", pid);
        out_native(0, pc, 1);
    }
    out_flush();

    py_k = 0;
    outf("==%d==capsan: Python stack of the crashing thread, innermost first:\n", pid);
    int npy = cs_stack_crash_python(PY_FRAMES, out_python, NULL);
    if (!npy)
        outf("    (none: %s)\n", cs_py.layout ? "no Python frames on this thread"
                                             : "this CPython's frame layout is not in capsan's table");
    else if (npy > PY_FRAMES)
        outf("    ... %d more frame(s)\n", npy - PY_FRAMES);
    out_flush();
    if (traced) /* the same stacks, for capsan report */
        cs_crashrec_write(walked ? &w : NULL, first, pc, tid);

    unsigned total = cs_findings_total();
    outf("==%d==capsan: %u finding(s) reported before the crash%s\n", pid, total,
         total ? ":" : "");
    if (total) {
        unsigned listed = cs_findings_crash_list(FINDINGS_LISTED, out_finding, NULL);
        if (listed < total)
            outf("    (%u more: see the trace)\n", total - listed);
    }
    out_flush();

    if (traced) {
        const char *tp = cs_trace_abs_path();
        outf("==%d==capsan: trace: %s; render it with: ", pid, tp);
        out_word(cli);
        out_put(" report ", 8);
        out_word(tp);
        out_put("\n", 1);
    } else if (cs_log_path_none(cs_opt.log_path)) {
        outf("==%d==capsan: no trace file (log_path=%s)\n", pid, cs_opt.log_path);
    } else if (cs_trace_failed()) {
        outf("==%d==capsan: no trace: capsan could not create its trace file (log_path=%s)\n", pid,
             cs_opt.log_path);
    } else {
        outf("==%d==capsan: no trace: the trace file was being created when the process "
             "crashed\n", pid);
    }
    out_flush();
}

/* ---- the handler ---- */

static const int crash_sigs[] = {SIGSEGV, SIGBUS, SIGILL, SIGFPE, SIGABRT};
static struct sigaction old_act[NSIG];
static _Atomic int reporter;    /* the thread writing the report (its tid) */
static _Atomic int report_done;
static int report_sig;

/* die by sig now, as if no handler were installed */
static void die_by(int sig)
{
    struct sigaction dfl;
    sigset_t set;
    memset(&dfl, 0, sizeof dfl);
    dfl.sa_handler = SIG_DFL;
    sigaction(sig, &dfl, NULL);
    sigemptyset(&set);
    sigaddset(&set, sig);
    pthread_sigmask(SIG_UNBLOCK, &set, NULL);
    raise(sig);
    _exit(128 + sig);
}

static void on_crash(int sig, siginfo_t *si, void *ucv)
{
    int me = (int)syscall(SYS_gettid), other = 0;
    if (cs_runtime_running() && atomic_compare_exchange_strong(&reporter, &other, me)) {
        report_sig = sig;
        report(sig, si, ucv);
        atomic_store(&report_done, 1);
    } else if (other == me && !atomic_load(&report_done)) {
        /* capsan's report itself failed (another signal than the one it
         * tells of): the process ends as the crash it was telling */
        die_by(report_sig);
    } else if (other) {
        /* another thread is telling its crash: let it finish (10 s at most) */
        struct timespec t = {0, 10000000};
        for (int i = 0; i < 1000 && !atomic_load(&report_done); i++)
            nanosleep(&t, NULL);
    }
    sigaction(sig, &old_act[sig], NULL);
    if (si->si_code <= 0) /* sent, not a fault: it will not happen again */
        raise(sig);
}

/* faulthandler's handler: a plain one with SA_NODEFER, in the object that
 * holds the C API (nothing else in CPython handles these signals). Once
 * done it restores the handler it replaced and raises the signal again,
 * so capsan's may go on top of it; any other handler of the program's
 * stays in charge alone. */
static int is_faulthandler(const struct sigaction *sa)
{
    Dl_info a, b;
    return !(sa->sa_flags & SA_SIGINFO) && (sa->sa_flags & SA_NODEFER) &&
           sa->sa_handler != SIG_DFL && sa->sa_handler != SIG_IGN && cs_py.Capsule_New &&
           dladdr((void *)sa->sa_handler, &a) && dladdr((void *)cs_py.Capsule_New, &b) &&
           a.dli_fbase == b.dli_fbase;
}

void cs_crash_init(void)
{
    if (*cs_cli_path()) /* found now: nothing is looked up in the handler */
        cli = cs_cli_path();
    save_stderr();
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = on_crash;
    sa.sa_flags = SA_SIGINFO | SA_ONSTACK;
    sigemptyset(&sa.sa_mask);
    for (size_t i = 0; i < sizeof crash_sigs / sizeof crash_sigs[0]; i++) {
        struct sigaction cur;
        sigaction(crash_sigs[i], NULL, &cur);
        /* the program's own handler stays in charge */
        if (cur.sa_handler != SIG_DFL && !is_faulthandler(&cur))
            continue;
        sigaction(crash_sigs[i], &sa, &old_act[crash_sigs[i]]);
    }
}
