/* `capsan report`: read any number of traces (each in one pass, reader.h),
 * order them as a process tree (children after their parents, by start
 * time), and render every process's findings as text, JSON, HTML, or as
 * suppression lines (--gen-suppressions).
 *
 * Text follows LeakSanitizer: errors as they were found, then leaks
 * grouped by kind and the stack of their first event, largest first, at
 * most max_findings blocks per process ("Omitting N more finding(s).").
 * JSON always holds every finding.
 *
 * This file: the command's flags, the output file, and the run over the
 * traces; its parts are named in report_int.h. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <fcntl.h>
#include <glob.h>
#include <unistd.h>

#include "report.h"
#include "report_int.h"
#include "usage.h"
#include "util.h"
#include "html.h"
#include "json.h"
#include "sarif.h"
#include "leakgroups.h"
#include "suppress.h"
#include "symbolize.h"

static void file_write(void *ud, const char *s, size_t n)
{
    fwrite(s, 1, n, (FILE *)ud);
}

int cs_report_text_one(const char *path, FILE *out)
{
    entry e = {.path = path, .parent = -1};
    report_read_header(&e);
    cs_out o = {.write = file_write, .ud = out};
    report_ctx c = {.format = FMT_TEXT, .max_flag = -1, .out = &o};
    int rc = report_one(&e, NULL, &c, NULL);
    fflush(out);
    for (size_t i = 0; i < c.lcap; i++)
        free(c.lines[i]);
    free(c.lines);
    cs_lg_free(&c.groups);
    free(e.line);
    return rc;
}

/* A trace named twice (a shell glob and an explicit path, a symlink) is
 * reported once: its process would otherwise appear twice in the tree. */
static size_t drop_repeats(entry *ents, size_t n)
{
    size_t kept = 0;
    struct stat *st = cs_xcalloc(n, sizeof *st);
    for (size_t i = 0; i < n; i++) {
        int known = stat(ents[i].path, &st[kept]) == 0;
        size_t j = 0;
        /* an entry that could not be stat'ed has inode 0: it matches nothing */
        while (known && j < kept && !(st[j].st_ino && st[j].st_dev == st[kept].st_dev &&
                                      st[j].st_ino == st[kept].st_ino))
            j++;
        if (known && j < kept) {
            fprintf(stderr, "capsan: %s is the same file as %s: reported once\n", ents[i].path,
                    ents[j].path);
            continue;
        }
        if (!known) /* reported as it is (cannot open) further on */
            memset(&st[kept], 0, sizeof st[kept]);
        ents[kept] = ents[i];
        ents[kept].argi = kept;
        kept++;
    }
    free(st);
    return kept;
}

/* -o must not destroy a trace: neither one of those being read (it is
 * truncated before it is read), nor any other (`-o capsan.trace.*`: the
 * shell made the first trace the output). */
static void check_output(const char *outpath, const entry *ents, size_t n)
{
    struct stat out, st;
    if (stat(outpath, &out) != 0 || !S_ISREG(out.st_mode))
        return;                     /* new, or a device such as /dev/stdout */
    for (size_t i = 0; i < n; i++)
        if (stat(ents[i].path, &st) == 0 && st.st_dev == out.st_dev && st.st_ino == out.st_ino)
            cs_usage_error("report: -o %s is also a trace to report: writing the report "
                           "would destroy it", outpath);
    int fd = open(outpath, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    char magic[8];
    if (fd >= 0 && read(fd, magic, sizeof magic) == (ssize_t)sizeof magic &&
        memcmp(magic, CS_TRACE_MAGIC, sizeof magic) == 0) {
        close(fd);
        cs_usage_error("report: -o %s is a capsan trace: refusing to overwrite it "
                       "(did a glob follow -o?)", outpath);
    }
    if (fd >= 0)
        close(fd);
}

/* `capsan report` alone: the traces the default log_path left in the
 * current directory, in name order (glob sorts them). The names live to
 * the end of the command. */
static size_t traces_here(entry **ents)
{
    static glob_t g;
    *ents = NULL;
    if (glob("capsan.trace.[0-9]*", 0, NULL, &g) != 0)
        return 0;
    size_t n = 0;
    *ents = cs_xcalloc(g.gl_pathc + 1, sizeof **ents);
    for (size_t i = 0; i < g.gl_pathc; i++) {
        /* capsan.trace.PID only, not the .json or .html made beside it */
        if (strspn(g.gl_pathv[i] + 13, "0123456789") != strlen(g.gl_pathv[i] + 13))
            continue;
        (*ents)[n].path = g.gl_pathv[i];
        (*ents)[n].argi = n;
        n++;
    }
    if (n)
        fprintf(stderr, "capsan: reporting the %zu trace file(s) in the current directory\n", n);
    return n;
}

int cs_cmd_report(int argc, char **argv)
{
    int format = FMT_TEXT, gen = 0, sarif = 0;
    long max_flag = -1;
    const char *outpath = NULL, *supppath = NULL, *strip = NULL;
    entry *ents = cs_xcalloc((size_t)argc + 1, sizeof *ents);
    size_t n = 0;
    int rest = 0;
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i];
        if (rest || a[0] != '-' || strcmp(a, "-") == 0) {
            if (!*a) /* an unset shell variable */
                cs_usage_error("report: an empty trace file name");
            if (!rest && strcmp(a, "-") == 0) /* a trace is mapped, not streamed */
                cs_usage_error("report: traces are read from files, not from standard input "
                               "('-'); name the trace file (./- for a file called '-')");
            ents[n].path = argv[i];
            ents[n].argi = n;
            n++;
        } else if (strcmp(a, "--") == 0) {
            rest = 1;
        } else if (strcmp(a, "-h") == 0 || strcmp(a, "--help") == 0) {
            fputs(cs_usage_text, stdout);
            free(ents);
            return 0;
        } else if (strncmp(a, "--format", 8) == 0 && (a[8] == 0 || a[8] == '=')) {
            const char *v = cs_flag_value(argc, argv, &i, "--format");
            if (strcmp(v, "text") == 0)
                format = FMT_TEXT;
            else if (strcmp(v, "json") == 0)
                format = FMT_JSON;
            else if (strcmp(v, "html") == 0)
                format = FMT_HTML;
            else if (strcmp(v, "sarif") == 0)
                format = FMT_JSON, sarif = 1; /* the JSON report, rewritten at the end */
            else
                cs_usage_error("report: unknown format '%s' (text, json, html or sarif)", v);
        } else if (strcmp(a, "-o") == 0) {
            if (!*(outpath = cs_flag_value(argc, argv, &i, "-o")))
                cs_usage_error("report: -o needs a file name");
        } else if (strncmp(a, "--output", 8) == 0 && (a[8] == 0 || a[8] == '=')) {
            if (!*(outpath = cs_flag_value(argc, argv, &i, "--output")))
                cs_usage_error("report: --output needs a file name");
        } else if (strncmp(a, "--suppressions", 14) == 0 && (a[14] == 0 || a[14] == '=')) {
            if (!*(supppath = cs_flag_value(argc, argv, &i, "--suppressions")))
                cs_usage_error("report: --suppressions needs a file name");
        } else if (strncmp(a, "--max-findings", 14) == 0 && (a[14] == 0 || a[14] == '=')) {
            const char *v = cs_flag_value(argc, argv, &i, "--max-findings");
            char *end;
            errno = 0;
            max_flag = strtol(v, &end, 10);
            if (!*v || *end || errno || max_flag < 0)
                cs_usage_error("report: --max-findings wants a number >= 0 (0: all), got '%s'", v);
        } else if (strncmp(a, "--strip-path-prefix", 19) == 0 && (a[19] == 0 || a[19] == '=')) {
            strip = cs_flag_value(argc, argv, &i, "--strip-path-prefix");
        } else if (strcmp(a, "--gen-suppressions") == 0) {
            gen = 1;
        } else {
            cs_usage_error("report: unknown flag '%s'", a);
        }
    }
    if (!n) {
        free(ents);
        n = traces_here(&ents);
    }
    if (!n)
        cs_usage_error("report: no trace files given, and no capsan.trace.* in the current "
                       "directory (capsan report [flags] TRACE...)");
    n = drop_repeats(ents, n);
    if (gen)
        format = FMT_SUPP;

    report_ctx c = { .format = format, .max_flag = max_flag, .strip_flag = strip };
    if (supppath) {
        char err[600];
        c.flag_supp = cs_supp_load(supppath, err, sizeof err);
        if (!c.flag_supp)
            cs_usage_error("report: %s", err);
    }
    if (outpath)
        check_output(outpath, ents, n);
    FILE *out = stdout;
    if (outpath && !(out = fopen(outpath, "w"))) {
        int e = errno;
        char dir[4096] = ".";
        const char *slash = strrchr(outpath, '/');
        struct stat st;
        if (slash)
            snprintf(dir, sizeof dir, "%.*s", slash == outpath ? 1 : (int)(slash - outpath), outpath);
        if (e == ENOENT && stat(dir, &st) != 0)
            cs_usage_error("report: cannot write the report to %s: directory %s does not exist",
                           outpath, dir);
        cs_usage_error("report: cannot write the report to %s: %s", outpath, strerror(e));
    }
    /* SARIF is written from the finished JSON report (sarif.h) */
    char *sarif_buf = NULL;
    size_t sarif_len = 0;
    FILE *sink = out;
    if (sarif && !(sink = open_memstream(&sarif_buf, &sarif_len)))
        cs_usage_error("report: out of memory");
    cs_out o = {
        .write = file_write, .ud = sink,
        .color = !outpath && format == FMT_TEXT && isatty(fileno(stdout)) && !getenv("NO_COLOR"),
    };
    c.out = &o;

    for (size_t i = 0; i < n; i++)
        report_read_header(&ents[i]);
    size_t *order = report_tree_order(ents, n);

    int rc = 0;
    if (format == FMT_JSON)
        cs_json_begin(&c.json, &o);
    if (format == FMT_HTML) {
        char err[300];
        if (!(c.html = cs_html_begin(out, err, sizeof err))) {
            fprintf(stderr, "capsan: %s\n", err);
            rc = 1;
            goto done;
        }
    }
    if (format == FMT_SUPP)
        cs_outf(&o, "# capsan suppressions (capsan report --gen-suppressions): one KIND:pattern "
                "line per finding;\n# use with capsan report --suppressions FILE or "
                "CAPSAN_OPTIONS=suppressions=FILE\n");
    for (size_t k = 0; k < n; k++) {
        entry *e = &ents[order[k]];
        const entry *parent = e->parent >= 0 ? &ents[e->parent] : NULL;
        if (e->json_report) {
            fprintf(stderr, "capsan: %s is a JSON report (report=json), not a trace: skipped\n",
                    e->path);
            continue;
        }
        if (e->saved) {
            rc |= report_saved(e, &c, format == FMT_TEXT && outpath ? out : NULL);
            continue;
        }
        rc |= report_one(e, parent, &c, format == FMT_TEXT && outpath ? out : NULL);
    }
    switch (format) {
    case FMT_JSON:
        cs_json_end(&c.json);
        if (sarif) {
            char err[300];
            fclose(sink);
            sink = out;
            if (cs_sarif_write(out, sarif_buf, sarif_len, err, sizeof err) != 0) {
                fprintf(stderr, "capsan: writing SARIF failed: %s\n", err);
                rc = 1;
            }
        }
        break;
    case FMT_HTML:
        if (cs_html_end(c.html) != 0) {
            fprintf(stderr, "capsan: writing the HTML page failed: %s\n", strerror(errno));
            rc = 1;
        }
        break;
    case FMT_SUPP:
        cs_outf(&o, "# %u finding(s), %zu distinct line(s)", c.gen_findings, c.ln);
        if (c.gen_unnamed)
            cs_outf(&o, ", %u without a stack to name", c.gen_unnamed);
        cs_outf(&o, "\n");
        break;
    default:
        cs_supp_render_used(c.flag_supp, &o);
        report_text_tree(&o, ents, order, n);
    }

done:
    if (sink != out)
        fclose(sink);
    free(sarif_buf);
    if (fflush(out) != 0 || ferror(out)) {
        fprintf(stderr, "capsan: writing %s failed: %s\n", outpath ? outpath : "the report",
                strerror(errno));
        rc = 1;
    }
    if (out != stdout)
        fclose(out);
    cs_supp_free(c.flag_supp);
    for (size_t i = 0; i < c.lcap; i++)
        free(c.lines[i]);
    free(c.lines);
    cs_lg_free(&c.groups);
    for (size_t i = 0; i < n; i++)
        free(ents[i].line);
    free(order);
    free(ents);
    cs_sym_cleanup();
    return rc;
}
