/* build/bin/capsan: `run` (start a program with the runtime preloaded),
 * `report` (report.c: replay and render traces), `symbolize` (symcmd.c),
 * `help-options`. */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "report.h"
#include "symcmd.h"
#include "usage.h"
#include "options.h"
#include "runsummary.h"
#include "tracename.h"
#include "seal.h"
#include "suppress.h"

#define EXIT_INTERNAL 125          /* run: capsan itself failed, as timeout(1) */

/* ---- the options: the runtime's own table and parser (options.c) ------ */

static int help_options(void)
{
    printf("capsan options: CAPSAN_OPTIONS=\"key=value:key=value\" (or capsan run --options ...)\n\n");
    fflush(stdout);
    cs_options_help(1);
    return 0;
}

/* ---- run ------------------------------------------------------------------- */

static volatile sig_atomic_t child_pid;

static void forward_signal(int sig)
{
    if (child_pid > 0)
        kill((pid_t)child_pid, sig);
}

/* The runtime sits at ../lib/libcapsan.so from this executable, both in
 * the build tree and after make install. */
static char *find_runtime(void)
{
    char self[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
    if (n <= 0)
        return NULL;
    self[n] = 0;
    char *slash = strrchr(self, '/');
    if (!slash)
        return NULL;
    *slash = 0;
    char cand[PATH_MAX + 32];
    snprintf(cand, sizeof cand, "%s/../lib/libcapsan.so", self);
    char *real = realpath(cand, NULL);
    if (!real) {
        fprintf(stderr, "capsan: cannot find the runtime at %s: %s (run make?)\n",
                cand, strerror(errno));
        return NULL;
    }
    return real;
}

typedef struct kv {
    char *text;               /* "key=value" */
    size_t keylen;
} kv;

typedef struct kvlist {
    kv *v;
    size_t n, cap;
} kvlist;

static void kv_set(kvlist *l, const char *text, size_t len)
{
    const char *eq = memchr(text, '=', len);
    size_t keylen = eq ? (size_t)(eq - text) : len;
    /* a later setting of the same key replaces the earlier one */
    for (size_t i = 0; i < l->n; i++)
        if (l->v[i].keylen == keylen && strncmp(l->v[i].text, text, keylen) == 0) {
            free(l->v[i].text);
            memmove(&l->v[i], &l->v[i + 1], (l->n - i - 1) * sizeof *l->v);
            l->n--;
            break;
        }
    if (l->n == l->cap) {
        l->cap = l->cap ? l->cap * 2 : 16;
        l->v = realloc(l->v, l->cap * sizeof *l->v);
        if (!l->v) {
            fputs("capsan: out of memory\n", stderr);
            exit(EXIT_INTERNAL);
        }
    }
    l->v[l->n].text = strndup(text, len);
    l->v[l->n].keylen = keylen;
    l->n++;
}

static void check_flag_option(const char *text, size_t len);

/* "k=v:k=v" (or ','-separated) into l; with check, each must be valid */
static void kv_parse(kvlist *l, const char *s, int check)
{
    while (s && *s) {
        size_t len = strcspn(s, ":,");
        if (len && check)
            check_flag_option(s, len);
        if (len)
            kv_set(l, s, len);
        s += len;
        if (*s)
            s++;
    }
}

static void kv_free(kvlist *l)
{
    for (size_t i = 0; i < l->n; i++)
        free(l->v[i].text);
    free(l->v);
    memset(l, 0, sizeof *l);
}

static const char *kv_get(const kvlist *l, const char *key)
{
    size_t kl = strlen(key);
    for (size_t i = 0; i < l->n; i++)
        if (l->v[i].keylen == kl && strncmp(l->v[i].text, key, kl) == 0)
            return l->v[i].text[kl] == '=' ? l->v[i].text + kl + 1 : "";
    return NULL;
}

/* Validates flag-supplied options with the runtime's parser. */
static void check_flag_option(const char *text, size_t len)
{
    char kv[1024], err[1024];
    snprintf(kv, sizeof kv, "%.*s", (int)len, text);
    cs_options_defaults();
    if (cs_options_parse(kv, "the command line", err, sizeof err) != 0)
        cs_usage_error("run: %s", strncmp(err, "capsan: ", 8) ? err : err + 8);
}

/* The runtime names a bad CAPSAN_OPTIONS value and runs the program with
 * the default; `capsan run` refuses it before starting anything, naming
 * every one (cs_options_parse writes one "capsan: ..." line each). */
static void check_env_options(const char *s)
{
    char err[4096] = "";
    if (!s || !*s)
        return;
    cs_options_defaults();
    if (cs_options_parse(s, "CAPSAN_OPTIONS", err, sizeof err) == 0)
        return;
    for (char *line = err; *line;) {
        size_t n = strcspn(line, "\n");
        const char *text = strncmp(line, "capsan: ", 8) ? line : line + 8;
        fprintf(stderr, "capsan: run: %.*s\n", (int)(n - (size_t)(text - line)), text);
        line += n + (line[n] == '\n');
    }
    fputs("(capsan --help for usage)\n", stderr);
    exit(EXIT_USAGE);
}

/* The traces are log_path.PID: the runtime only finds out that it cannot
 * create them once the program runs (and then runs it without a trace).
 * Refuse a log_path whose directory is missing or not writable, and one
 * that names a directory (it is a prefix: DIR/ would make hidden DIR/.PID
 * files). A %p goes in the file's name: the run finds its traces by it. */
static void check_log_path(const char *lp)
{
    struct stat st;
    char dir[PATH_MAX];
    const char *pp = strstr(lp, "%p"), *last = strrchr(lp, '/');
    if (pp && last && pp < last)
        cs_usage_error("run: log_path '%s': %%p may only be in the file name, not in a "
                       "directory", lp);
    if (stat(lp, &st) == 0 && S_ISDIR(st.st_mode)) {
        size_t n = strlen(lp);
        while (n > 1 && lp[n - 1] == '/')
            n--;
        cs_usage_error("run: log_path '%s' is a directory; it is a file name prefix (each "
                       "process writes log_path.PID): try %.*s/capsan.trace", lp, (int)n, lp);
    }
    const char *slash = strrchr(lp, '/');
    if (!slash)
        snprintf(dir, sizeof dir, ".");
    else
        snprintf(dir, sizeof dir, "%.*s", slash == lp ? 1 : (int)(slash - lp), lp);
    if (stat(dir, &st) != 0)
        cs_usage_error("run: log_path '%s': directory %s: %s", lp, dir, strerror(errno));
    if (!S_ISDIR(st.st_mode))
        cs_usage_error("run: log_path '%s': %s is not a directory", lp, dir);
    if (access(dir, W_OK | X_OK) != 0)
        cs_usage_error("run: log_path '%s': cannot create files in %s: %s", lp, dir,
                       strerror(errno));
}

/* The runtime would name a missing or bad suppressions file and then
 * report every finding it meant to suppress (and fail the run for them). */
static void check_suppressions(const char *path)
{
    char err[1024];
    if (!path || !*path)
        return;
    cs_suppressions *s = cs_supp_load(path, err, sizeof err);
    if (!s)
        cs_usage_error("run: suppressions: %s", err);
    cs_supp_free(s);
}


/* A process of the run that left its trace without an END: a descendant
 * killed by a signal capsan does not catch (SIGTERM from its parent, as
 * multiprocessing's terminate() sends; SIGKILL), or one still running. No
 * one printed its report: its trace is replayed here, as `capsan report`
 * would show it. */
static void report_unended(const char *path, long pid, void *ud)
{
    (void)ud;
    cs_report_text_one(path, stderr);
    fprintf(stderr, "capsan: process %ld ended without capsan seeing it end (killed by a signal "
                    "such as SIGTERM or SIGKILL, or still running); trace: %s\n", pid, path);
}

static int cmd_run(int argc, char **argv)
{
    kvlist flags = { 0 };
    int i = 0;
    for (; i < argc; i++) {
        const char *a = argv[i];
        char buf[PATH_MAX + 64];
        if (strcmp(a, "--") == 0) {
            i++;
            break;
        }
        if (a[0] != '-')
            break;                  /* the command starts here */
        if (strcmp(a, "-h") == 0 || strcmp(a, "--help") == 0) {
            fputs(cs_usage_text, stdout);
            return 0;
        } else if (strncmp(a, "--log-path", 10) == 0 && (a[10] == 0 || a[10] == '=')) {
            const char *v = cs_flag_value(argc, argv, &i, "--log-path");
            if (!*v || strpbrk(v, ":,"))
                cs_usage_error("run: --log-path must be non-empty and free of ':' and ','");
            snprintf(buf, sizeof buf, "log_path=%s", v);
            kv_set(&flags, buf, strlen(buf));
        } else if (strncmp(a, "--exitcode", 10) == 0 && (a[10] == 0 || a[10] == '=')) {
            const char *v = cs_flag_value(argc, argv, &i, "--exitcode");
            snprintf(buf, sizeof buf, "exitcode=%s", v);
            check_flag_option(buf, strlen(buf));
            kv_set(&flags, buf, strlen(buf));
        } else if (strcmp(a, "--protect") == 0) {
            kv_set(&flags, "protect=1", 9);
        } else if (strcmp(a, "--halt-on-error") == 0) {
            kv_set(&flags, "halt_on_error=1", 15);
        } else if (strcmp(a, "--keep-trace") == 0) {
            kv_set(&flags, "keep_trace=always", 17);
        } else if (strncmp(a, "--options", 9) == 0 && (a[9] == 0 || a[9] == '=')) {
            kv_parse(&flags, cs_flag_value(argc, argv, &i, "--options"), 1);
        } else {
            cs_usage_error("run: unknown flag '%s'", a);
        }
    }
    if (i >= argc)
        cs_usage_error("run: no command given (capsan run [flags] -- CMD ARGS...)");
    char **cmd = argv + i;
    if (!*cmd[0]) /* an unset shell variable */
        cs_usage_error("run: an empty command name");

    check_env_options(getenv("CAPSAN_OPTIONS"));
    char *lib = find_runtime();
    if (!lib)
        return EXIT_INTERNAL;

    /* user options first, flags win */
    kvlist opts = { 0 };
    kv_parse(&opts, getenv("CAPSAN_OPTIONS"), 0);
    for (size_t k = 0; k < flags.n; k++)
        kv_set(&opts, flags.v[k].text, strlen(flags.v[k].text));
    /* every process keeps its trace for the run's summary; the run then
     * removes the clean ones itself, unless asked to keep them */
    const char *keep = kv_get(&opts, "keep_trace");
    int keep_all = keep && !strcmp(keep, "always");
    kv_set(&opts, "keep_trace=always", 17);
    size_t total = 1;
    for (size_t k = 0; k < opts.n; k++)
        total += strlen(opts.v[k].text) + 1;
    char *optstr = calloc(1, total);
    for (size_t k = 0; optstr && k < opts.n; k++) {
        if (k)
            strcat(optstr, ":");
        strcat(optstr, opts.v[k].text);
    }
    /* help=1: the runtime would print the list and end the program before
     * it ran; the list is all there is to say */
    const char *help = kv_get(&opts, "help");
    if (help && (!strcmp(help, "1") || !strcmp(help, "true") || !strcmp(help, "yes"))) {
        kv_free(&opts);
        kv_free(&flags);
        free(optstr);
        free(lib);
        return help_options();
    }
    const char *log_path = kv_get(&opts, "log_path");
    if (!log_path || !*log_path)
        log_path = cs_option_default("log_path");
    int no_trace = cs_log_path_none(log_path);
    if (!no_trace)
        check_log_path(log_path);
    check_suppressions(kv_get(&opts, "suppressions"));

    /* ours first, keeping whatever the user preloads */
    const char *old = getenv("LD_PRELOAD");
    char *preload;
    if (old && *old && !strstr(old, lib)) {
        preload = malloc(strlen(lib) + strlen(old) + 2);
        if (preload)
            sprintf(preload, "%s:%s", lib, old);
    } else {
        preload = strdup(old && *old ? old : lib);
    }
    if (!preload || !optstr) {
        fputs("capsan: out of memory\n", stderr);
        return EXIT_INTERNAL;
    }

    /* the terminal's ^C reaches the child directly; capsan outlives it to
     * report its status, and passes on polite termination requests */
    struct sigaction ign = { .sa_handler = SIG_IGN }, fwd = { .sa_handler = forward_signal };
    struct sigaction old_int, old_quit;
    sigaction(SIGINT, &ign, &old_int);
    sigaction(SIGQUIT, &ign, &old_quit);
    sigaction(SIGTERM, &fwd, NULL);
    sigaction(SIGHUP, &fwd, NULL);

    struct timespec run_start;
    clock_gettime(CLOCK_REALTIME, &run_start);
    fflush(NULL);
    /* a failed exec says so through this pipe (closed by a good one): then
     * its one line is all the run has to say */
    int execfd[2];
    if (pipe2(execfd, O_CLOEXEC) != 0)
        execfd[0] = execfd[1] = -1;
    pid_t pid = fork();
    if (pid < 0) {
        fprintf(stderr, "capsan: fork: %s\n", strerror(errno));
        return EXIT_INTERNAL;
    }
    if (pid == 0) {
        struct sigaction dfl = { .sa_handler = SIG_DFL };
        sigaction(SIGINT, &old_int, NULL);
        sigaction(SIGQUIT, &old_quit, NULL);
        sigaction(SIGTERM, &dfl, NULL);
        sigaction(SIGHUP, &dfl, NULL);
        setenv("LD_PRELOAD", preload, 1);
        setenv("CAPSAN_OPTIONS", optstr, 1);
        execvp(cmd[0], cmd);
        int e = errno;
        fprintf(stderr, "capsan: cannot run %s: %s\n", cmd[0], strerror(e));
        if (execfd[1] >= 0 && write(execfd[1], &e, sizeof e) < 0)
            e = errno; /* the status still says it */
        _exit(e == ENOENT ? 127 : 126);
    }
    child_pid = pid;
    int exec_failed = 0;
    if (execfd[1] >= 0) {
        close(execfd[1]);
        int e;
        ssize_t got;
        while ((got = read(execfd[0], &e, sizeof e)) < 0 && errno == EINTR)
            ;
        exec_failed = got == (ssize_t)sizeof e;
        close(execfd[0]);
    }
    int status, rc;
    while ((rc = waitpid(pid, &status, 0)) < 0 && errno == EINTR)
        ;
    if (rc < 0) {
        fprintf(stderr, "capsan: waitpid: %s\n", strerror(errno));
        rc = EXIT_INTERNAL;
    } else if (WIFSIGNALED(status)) {
        int sig = WTERMSIG(status);
        char trace[PATH_MAX + 32] = "";
        if (cs_trace_name(trace, sizeof trace, log_path, (long)pid) == 0 &&
            access(trace, F_OK) == 0) {
            /* no handler saw it (SIGKILL): the trace gets the END that says so */
            char why[600];
            int sealed = cs_trace_seal(trace, (long)pid, sig, why, sizeof why);
            if (sealed < 0)
                fprintf(stderr, "capsan: %s: cannot record how the process ended: %s\n", trace, why);
            else if (sealed > 0) /* its report, as it would have printed at exit */
                cs_report_text_one(trace, stderr);
            fprintf(stderr, "capsan: %s killed by signal %d; trace: %s\n", cmd[0], sig, trace);
        } else if (no_trace) {
            fprintf(stderr, "capsan: %s killed by signal %d (log_path=%s: no trace)\n", cmd[0],
                    sig, log_path);
        } else /* a child that recorded nothing, or one whose file could not be made */
            fprintf(stderr, "capsan: %s killed by signal %d; it left no trace (%s: %s)\n",
                    cmd[0], sig, trace, strerror(errno));
        rc = 128 + sig;
    } else if (exec_failed) {
        rc = WIFEXITED(status) ? WEXITSTATUS(status) : EXIT_INTERNAL;
    } else {
        rc = WIFEXITED(status) ? WEXITSTATUS(status) : EXIT_INTERNAL;
        if (!no_trace) /* else each process printed its own findings */
            cs_run_summary(log_path, (uint64_t)run_start.tv_sec * 1000000000ull +
                                         (uint64_t)run_start.tv_nsec, stderr, report_unended,
                           NULL, !keep_all);
    }
    kv_free(&opts);
    kv_free(&flags);
    free(optstr);
    free(preload);
    free(lib);
    return rc;
}

#ifndef CAPSAN_VERSION /* the build passes the package's (pyhook/capsan/__init__.py) */
#define CAPSAN_VERSION "unknown"
#endif

int main(int argc, char **argv)
{
    if (argc < 2) {
        fputs(cs_usage_text, stderr);
        return EXIT_USAGE;
    }
    const char *cmd = argv[1];
    if (strcmp(cmd, "run") == 0)
        return cmd_run(argc - 2, argv + 2);
    if (strcmp(cmd, "report") == 0)
        return cs_cmd_report(argc - 2, argv + 2);
    if (strcmp(cmd, "help-options") == 0)
        return help_options();
    if (strcmp(cmd, "symbolize") == 0)
        return cs_cmd_symbolize(argc - 2, argv + 2);
    if (strcmp(cmd, "--version") == 0 || strcmp(cmd, "version") == 0) {
        printf("capsan %s\n", CAPSAN_VERSION);
        return 0;
    }
    if (strcmp(cmd, "--help") == 0 || strcmp(cmd, "-h") == 0 || strcmp(cmd, "help") == 0) {
        fputs(cs_usage_text, stdout);
        return 0;
    }
    cs_usage_error("unknown command '%s'", cmd);
}
