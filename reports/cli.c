/* build/bin/capsan: `run` (start a program with the runtime preloaded),
 * `report` (replay and render traces), `help-options`. */
#include <errno.h>
#include <limits.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "json.h"
#include "reader.h"
#include "render.h"
#include "suppress.h"
#include "symbolize.h"

#define EXIT_USAGE 2
#define EXIT_INTERNAL 125          /* run: capsan itself failed, as timeout(1) */

/* ---- the option table, from the one X-macro ---------------------------- */

#define OPTDEF_STR(d) d
#define OPTDEF_INT(d) #d
#define OPTDEF_BOOL(d) #d
typedef struct opt_desc {
    const char *type, *name, *def, *help;
} opt_desc;
static const opt_desc options[] = {
#define OPT(type, name, def, help) { #type, #name, OPTDEF_##type(def), help },
#include "../preload/options.inc"
#undef OPT
};
#define NOPTIONS (sizeof options / sizeof options[0])

static const opt_desc *find_option(const char *name, size_t len)
{
    for (size_t i = 0; i < NOPTIONS; i++)
        if (strlen(options[i].name) == len && strncmp(options[i].name, name, len) == 0)
            return &options[i];
    return NULL;
}

static int help_options(void)
{
    printf("capsan options: CAPSAN_OPTIONS=\"key=value:key=value\" (or capsan run --options ...)\n\n");
    for (size_t i = 0; i < NOPTIONS; i++) {
        const opt_desc *o = &options[i];
        const char *type = strcmp(o->type, "STR") == 0 ? "string"
                         : strcmp(o->type, "BOOL") == 0 ? "bool" : "int";
        printf("  %-14s %-6s default %-14s %s\n", o->name, type,
               *o->def ? o->def : "\"\"", o->help);
    }
    return 0;
}

/* ---- messages ------------------------------------------------------------ */

static void usage_error(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void usage_error(const char *fmt, ...)
{
    va_list ap;
    fputs("capsan: ", stderr);
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputs("\n(capsan --help for usage)\n", stderr);
    exit(EXIT_USAGE);
}

static const char usage_text[] =
    "usage: capsan run [--log-path P] [--exitcode N] [--protect] [--halt-on-error]\n"
    "                  [--options K=V:K=V...] [--] CMD ARGS...\n"
    "         run CMD with the capsan runtime preloaded; its report is printed at exit\n"
    "       capsan report [--format text|json] [-o OUT] [--suppressions FILE] TRACE...\n"
    "         replay trace files (also truncated ones) and render their findings\n"
    "       capsan help-options\n"
    "         list every CAPSAN_OPTIONS key with its default\n"
    "       capsan --help\n";

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

static void kv_parse(kvlist *l, const char *s)
{
    while (s && *s) {
        size_t len = strcspn(s, ":");
        if (len)
            kv_set(l, s, len);
        s += len;
        if (*s)
            s++;
    }
}

static const char *kv_get(const kvlist *l, const char *key)
{
    size_t kl = strlen(key);
    for (size_t i = 0; i < l->n; i++)
        if (l->v[i].keylen == kl && strncmp(l->v[i].text, key, kl) == 0)
            return l->v[i].text[kl] == '=' ? l->v[i].text + kl + 1 : "";
    return NULL;
}

static int is_integer(const char *s)
{
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    (void)v;
    return *s && !*end && errno == 0;
}

/* Validates one flag-supplied option against the table. */
static void check_flag_option(const char *text, size_t len)
{
    const char *eq = memchr(text, '=', len);
    if (!eq)
        usage_error("run: option '%.*s' needs a value (key=value)", (int)len, text);
    const opt_desc *o = find_option(text, (size_t)(eq - text));
    if (!o)
        usage_error("run: unknown option '%.*s' (capsan help-options lists them)",
                    (int)(eq - text), text);
    char val[256];
    snprintf(val, sizeof val, "%.*s", (int)(len - (size_t)(eq - text) - 1), eq + 1);
    if (strcmp(o->type, "STR") != 0 && !is_integer(val))
        usage_error("run: option %s wants a number, got '%s'", o->name, val);
}

static char *flag_value(int argc, char **argv, int *i, const char *flag)
{
    size_t fl = strlen(flag);
    if (strncmp(argv[*i], flag, fl) == 0 && argv[*i][fl] == '=')
        return argv[*i] + fl + 1;
    if (*i + 1 >= argc)
        usage_error("%s needs a value", flag);
    return argv[++*i];
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
            fputs(usage_text, stdout);
            return 0;
        } else if (strncmp(a, "--log-path", 10) == 0 && (a[10] == 0 || a[10] == '=')) {
            const char *v = flag_value(argc, argv, &i, "--log-path");
            if (!*v || strchr(v, ':'))
                usage_error("run: --log-path must be non-empty and free of ':'");
            snprintf(buf, sizeof buf, "log_path=%s", v);
            kv_set(&flags, buf, strlen(buf));
        } else if (strncmp(a, "--exitcode", 10) == 0 && (a[10] == 0 || a[10] == '=')) {
            const char *v = flag_value(argc, argv, &i, "--exitcode");
            if (!is_integer(v) || atoi(v) < 0 || atoi(v) > 255)
                usage_error("run: --exitcode wants a number 0..255, got '%s'", v);
            snprintf(buf, sizeof buf, "exitcode=%s", v);
            kv_set(&flags, buf, strlen(buf));
        } else if (strcmp(a, "--protect") == 0) {
            kv_set(&flags, "protect=1", 9);
        } else if (strcmp(a, "--halt-on-error") == 0) {
            kv_set(&flags, "halt_on_error=1", 15);
        } else if (strncmp(a, "--options", 9) == 0 && (a[9] == 0 || a[9] == '=')) {
            const char *v = flag_value(argc, argv, &i, "--options");
            for (const char *s = v; *s;) {
                size_t len = strcspn(s, ":");
                if (len) {
                    check_flag_option(s, len);
                    kv_set(&flags, s, len);
                }
                s += len;
                if (*s)
                    s++;
            }
        } else {
            usage_error("run: unknown flag '%s'", a);
        }
    }
    if (i >= argc)
        usage_error("run: no command given (capsan run [flags] -- CMD ARGS...)");
    char **cmd = argv + i;

    char *lib = find_runtime();
    if (!lib)
        return EXIT_INTERNAL;

    /* user options first, flags win */
    kvlist opts = { 0 };
    kv_parse(&opts, getenv("CAPSAN_OPTIONS"));
    for (size_t k = 0; k < flags.n; k++)
        kv_set(&opts, flags.v[k].text, strlen(flags.v[k].text));
    size_t total = 1;
    for (size_t k = 0; k < opts.n; k++)
        total += strlen(opts.v[k].text) + 1;
    char *optstr = calloc(1, total);
    for (size_t k = 0; optstr && k < opts.n; k++) {
        if (k)
            strcat(optstr, ":");
        strcat(optstr, opts.v[k].text);
    }
    const char *log_path = kv_get(&opts, "log_path");
    if (!log_path || !*log_path)
        log_path = find_option("log_path", 8)->def;

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

    fflush(NULL);
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
        _exit(e == ENOENT ? 127 : 126);
    }
    child_pid = pid;
    int status;
    while (waitpid(pid, &status, 0) < 0) {
        if (errno != EINTR) {
            fprintf(stderr, "capsan: waitpid: %s\n", strerror(errno));
            return EXIT_INTERNAL;
        }
    }
    if (WIFSIGNALED(status)) {
        int sig = WTERMSIG(status);
        fprintf(stderr, "capsan: %s killed by signal %d; trace: %s.%d\n",
                cmd[0], sig, log_path, (int)pid);
        return 128 + sig;
    }
    return WIFEXITED(status) ? WEXITSTATUS(status) : EXIT_INTERNAL;
}

/* ---- report ---------------------------------------------------------------- */

enum { FMT_TEXT, FMT_JSON };

typedef struct report_ctx {
    cs_trace *t;
    cs_symbolizer *sym;
    cs_stack_source src;
    cs_proc_info pi;
    cs_summary sum;
    cs_suppressions *supp;
    cs_out *out;
    int format;
    cs_json json;
} report_ctx;

static int src_raw(void *ud, uint32_t stack, uint64_t *values, int max)
{
    return cs_trace_stack(((report_ctx *)ud)->t, stack, values, max);
}

static int src_native(void *ud, uint64_t ip, cs_frame_info *out, int max)
{
    return cs_sym_native(((report_ctx *)ud)->sym, ip, out, max);
}

static int src_code(void *ud, uint32_t code_id, const char **file, const char **name)
{
    const cs_code_rec *c = cs_trace_code(((report_ctx *)ud)->t, code_id);
    if (!c)
        return 0;
    *file = c->file;
    *name = c->name;
    return 1;
}

static void on_finding(void *ud, const cs_finding *f)
{
    report_ctx *c = ud;
    if (c->supp && cs_supp_match(c->supp, f, &c->src)) {
        c->sum.suppressed++;
        return;
    }
    cs_summary_add(&c->sum, f);
    if (c->format == FMT_JSON)
        cs_json_finding(&c->json, &c->pi, f, &c->src);
    else
        cs_render_text_finding(c->out, &c->pi, f, &c->src);
}

static void file_write(void *ud, const char *s, size_t n)
{
    fwrite(s, 1, n, (FILE *)ud);
}

static void text_header(report_ctx *c)
{
    cs_trace *t = c->t;
    cs_out *o = c->out;
    cs_outf(o, "== process %llu (", (unsigned long long)c->pi.pid);
    if (!t->has_process)
        cs_outf(o, "argv unknown");
    for (unsigned i = 0; i < t->argc; i++) {
        if (i)
            o->write(o->ud, " ", 1);
        o->write(o->ud, t->argv[i], strlen(t->argv[i]));
    }
    cs_outf(o, ") ended: ");
    switch (c->pi.ended) {
    case CS_END_EXIT:
        cs_outf(o, "exit %d ==\n", c->pi.status);
        break;
    case CS_END_HALT:
        cs_outf(o, "halted on error, exit %d ==\n", c->pi.status);
        break;
    case CS_END_QUICK_EXIT:
        cs_outf(o, "_exit %d (no leak check) ==\n", c->pi.status);
        break;
    case CS_END_SIGNAL: {
        const char *name = sigabbrev_np(c->pi.status);
        if (name)
            cs_outf(o, "signal %d (SIG%s) ==\n", c->pi.status, name);
        else
            cs_outf(o, "signal %d ==\n", c->pi.status);
        cs_frame_info fr[16];
        int n = t->end.pc ? cs_sym_native(c->sym, t->end.pc + 1, fr, 16) : 0;
        if (n > 0) {
            /* +1: the pc is the faulting instruction, not a return address */
            cs_outf(o, "   at pc 0x%llx", (unsigned long long)t->end.pc);
            if (fr[n - 1].function) {
                o->write(o->ud, " in ", 4);
                o->write(o->ud, fr[n - 1].function, strlen(fr[n - 1].function));
            }
            cs_outf(o, ", fault address 0x%llx\n", (unsigned long long)t->end.fault_addr);
        }
        break;
    }
    default:
        cs_outf(o, "unknown (no END record: killed, or still running) ==\n");
        break;
    }
}

static int report_one(const char *path, report_ctx *c, FILE *errf)
{
    char err[600];
    cs_trace *t = cs_trace_open(path, err, sizeof err);
    if (!t) {
        fprintf(stderr, "capsan: %s\n", err);
        if (errf)
            fprintf(errf, "capsan: %s\n", err);
        return 1;
    }
    c->t = t;
    c->sym = cs_sym_create(t->modules, t->nmodules, t->exe);
    c->src = (cs_stack_source){ .ud = c, .raw = src_raw, .native = src_native, .code = src_code };
    cs_trace_proc_info(t, &c->pi);
    memset(&c->sum, 0, sizeof c->sum);

    if (t->error) {
        fprintf(stderr, "capsan: %s\n", t->errmsg);
        if (errf)
            fprintf(errf, "capsan: %s\n", t->errmsg);
    }
    if (t->trailing_offset)
        fprintf(stderr, "capsan: %s: note: data after the end-of-data marker at offset 0x%llx "
                "ignored (a writer stopped mid-record)\n", path,
                (unsigned long long)t->trailing_offset);

    if (c->format == FMT_JSON) {
        cs_json_proc jp = {
            .info = &c->pi, .argv = (const char *const *)t->argv, .argc = t->argc,
            .exe = t->exe, .trace = path, .error = t->error ? t->errmsg : NULL,
            .end_time_ns = t->has_end ? t->end.time_ns : 0,
        };
        cs_json_process_begin(&c->json, &jp);
    } else {
        text_header(c);
    }
    cs_trace_replay(t, on_finding, c);
    /* the trace keeps the events of objects with findings; END counts all */
    c->sum.events = t->has_end && t->end.events > t->nevents ? t->end.events : t->nevents;
    if (c->format == FMT_JSON)
        cs_json_process_end(&c->json, &c->sum);
    else {
        cs_render_text_summary(c->out, &c->pi, &c->sum);
        cs_outf(c->out, "\n");
    }
    int rc = t->error ? 1 : 0;
    cs_sym_destroy(c->sym);
    cs_trace_close(t);
    c->t = NULL;
    c->sym = NULL;
    return rc;
}

static int cmd_report(int argc, char **argv)
{
    int format = FMT_TEXT;
    const char *outpath = NULL, *supppath = NULL;
    char **traces = calloc((size_t)argc + 1, sizeof *traces);
    int ntraces = 0, rest = 0;
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i];
        if (rest || a[0] != '-' || strcmp(a, "-") == 0) {
            traces[ntraces++] = argv[i];
        } else if (strcmp(a, "--") == 0) {
            rest = 1;
        } else if (strcmp(a, "-h") == 0 || strcmp(a, "--help") == 0) {
            fputs(usage_text, stdout);
            return 0;
        } else if (strncmp(a, "--format", 8) == 0 && (a[8] == 0 || a[8] == '=')) {
            const char *v = flag_value(argc, argv, &i, "--format");
            if (strcmp(v, "text") == 0)
                format = FMT_TEXT;
            else if (strcmp(v, "json") == 0)
                format = FMT_JSON;
            else
                usage_error("report: unknown format '%s' (text or json)", v);
        } else if (strcmp(a, "-o") == 0) {
            outpath = flag_value(argc, argv, &i, "-o");
        } else if (strncmp(a, "--output", 8) == 0 && (a[8] == 0 || a[8] == '=')) {
            outpath = flag_value(argc, argv, &i, "--output");
        } else if (strncmp(a, "--suppressions", 14) == 0 && (a[14] == 0 || a[14] == '=')) {
            supppath = flag_value(argc, argv, &i, "--suppressions");
        } else {
            usage_error("report: unknown flag '%s'", a);
        }
    }
    if (!ntraces)
        usage_error("report: no trace files given (capsan report [flags] TRACE...)");

    report_ctx c = { .format = format };
    if (supppath) {
        char err[600];
        c.supp = cs_supp_load(supppath, err, sizeof err);
        if (!c.supp)
            usage_error("report: %s", err);
    }
    FILE *out = stdout;
    if (outpath && !(out = fopen(outpath, "w"))) {
        fprintf(stderr, "capsan: cannot write %s: %s\n", outpath, strerror(errno));
        return 1;
    }
    cs_out o = {
        .write = file_write, .ud = out,
        .color = !outpath && format == FMT_TEXT && isatty(fileno(stdout)) && !getenv("NO_COLOR"),
    };
    c.out = &o;

    int rc = 0;
    if (format == FMT_JSON)
        cs_json_begin(&c.json, &o);
    for (int i = 0; i < ntraces; i++)
        rc |= report_one(traces[i], &c, format == FMT_TEXT && outpath ? out : NULL);
    if (format == FMT_JSON)
        cs_json_end(&c.json);
    else
        cs_supp_render_used(c.supp, &o);

    if (fflush(out) != 0 || ferror(out)) {
        fprintf(stderr, "capsan: writing %s failed: %s\n", outpath ? outpath : "the report",
                strerror(errno));
        rc = 1;
    }
    if (out != stdout)
        fclose(out);
    cs_supp_free(c.supp);
    free(traces);
    return rc;
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        fputs(usage_text, stderr);
        return EXIT_USAGE;
    }
    const char *cmd = argv[1];
    if (strcmp(cmd, "run") == 0)
        return cmd_run(argc - 2, argv + 2);
    if (strcmp(cmd, "report") == 0)
        return cmd_report(argc - 2, argv + 2);
    if (strcmp(cmd, "help-options") == 0)
        return help_options();
    if (strcmp(cmd, "--help") == 0 || strcmp(cmd, "-h") == 0 || strcmp(cmd, "help") == 0) {
        fputs(usage_text, stdout);
        return 0;
    }
    usage_error("unknown command '%s'", cmd);
}
