/* libFuzzer target for `capsan report` (make fuzz; make test replays
 * tests/fuzz/regressions/ with it).
 *
 * The input is one or more trace files back to back: a new one starts
 * wherever the "CAPSANTR" magic sits at an 8-byte aligned offset (at most
 * MAX_TRACES). An input without the magic is one file, which `capsan
 * report` reads as a pytest report when it is JSON (savedreport.c). An optional suppressions file may follow the line
 * SUPP_MARK. Each trace goes into a memfd, and the whole command runs over
 * the /proc/self/fd paths, exactly as a user would run it: reader,
 * lifecycle replay, process tree, symbolizer, suppressions and every
 * renderer, each run writing into another memfd through -o.
 *
 * Beyond crashes, leaks and sanitizer reports, the output itself is
 * checked, because a trace is untrusted input that ends up in a terminal,
 * a JSON consumer and a browser:
 *   - text: no control byte but newline (no terminal escapes);
 *   - JSON: strict RFC 8259 with valid UTF-8 strings;
 *   - HTML: valid UTF-8, no control byte but newline, and every '<'
 *     outside the page's own <style> and <script> opens one of the tags
 *     the writer uses (a name from a trace never becomes markup);
 *   - --gen-suppressions: its output loads as a suppressions file.
 * A failed check aborts with the reason, so libFuzzer keeps the input. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "report.h"
#include "suppress.h"
#include "symbolize.h"
#include "utf8.h"

#define MAX_TRACES 4
#define SUPP_MARK "\n#capsan-fuzz-suppressions\n"

static void fail(const char *what, const char *out, size_t n, size_t at)
{
    size_t from = at > 60 ? at - 60 : 0, to = at + 60 < n ? at + 60 : n;
    fprintf(stderr, "fuzz_report: %s at output offset %zu: ", what, at);
    for (size_t i = from; i < to; i++) {
        unsigned char c = (unsigned char)out[i];
        if (c >= 0x20 && c < 0x7f)
            fputc(c, stderr);
        else
            fprintf(stderr, "\\x%02x", c);
    }
    fputc('\n', stderr);
    abort();
}

static int memfd_with(const char *name, const uint8_t *data, size_t n)
{
    int fd = memfd_create(name, MFD_CLOEXEC);
    if (fd < 0) {
        perror("memfd_create");
        abort();
    }
    for (size_t off = 0; off < n;) {
        ssize_t w = write(fd, data + off, n - off);
        if (w <= 0) {
            perror("write memfd");
            abort();
        }
        off += (size_t)w;
    }
    return fd;
}

/* the whole content of fd, NUL-terminated, in a malloc'd buffer */
static char *slurp(int fd, size_t *n)
{
    off_t size = lseek(fd, 0, SEEK_END);
    char *buf = malloc((size_t)(size > 0 ? size : 0) + 1);
    if (!buf)
        abort();
    ssize_t got = size > 0 ? pread(fd, buf, (size_t)size, 0) : 0;
    if (got < 0)
        got = 0;
    buf[got] = 0;
    *n = (size_t)got;
    return buf;
}

/* ---- output checks ------------------------------------------------------ */

static void check_no_controls(const char *s, size_t n, const char *what)
{
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if ((c < 0x20 && c != '\n') || c == 0x7f)
            fail(what, s, n, i);
    }
}

static void check_utf8(const char *s, size_t n, const char *what)
{
    for (size_t i = 0; i < n;) {
        size_t k = cs_utf8_len((const unsigned char *)s + i, n - i);
        if (!k)
            fail(what, s, n, i);
        i += k;
    }
}

/* a strict JSON parser that only says yes or no */
typedef struct jp {
    const char *s;
    size_t n, i;
    int depth;
} jp;

static void jws(jp *p)
{
    while (p->i < p->n && (p->s[p->i] == ' ' || p->s[p->i] == '\n' || p->s[p->i] == '\t' ||
                           p->s[p->i] == '\r'))
        p->i++;
}

static int jlit(jp *p, const char *lit)
{
    size_t l = strlen(lit);
    if (p->n - p->i < l || memcmp(p->s + p->i, lit, l) != 0)
        return 0;
    p->i += l;
    return 1;
}

static int jhex(char c)
{
    return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F');
}

static int jstring(jp *p)
{
    if (p->i >= p->n || p->s[p->i] != '"')
        return 0;
    p->i++;
    while (p->i < p->n) {
        unsigned char c = (unsigned char)p->s[p->i];
        if (c == '"') {
            p->i++;
            return 1;
        }
        if (c < 0x20)
            return 0;
        if (c == '\\') {
            if (++p->i >= p->n)
                return 0;
            char e = p->s[p->i];
            if (e == 'u') {
                if (p->n - p->i < 5)
                    return 0;
                for (int k = 1; k <= 4; k++)
                    if (!jhex(p->s[p->i + k]))
                        return 0;
                p->i += 5;
                continue;
            }
            if (!strchr("\"\\/bfnrt", e) || !e)
                return 0;
            p->i++;
            continue;
        }
        size_t k = cs_utf8_len((const unsigned char *)p->s + p->i, p->n - p->i);
        if (!k)
            return 0;
        p->i += k;
    }
    return 0;
}

static int jnumber(jp *p)
{
    size_t start = p->i;
    if (p->i < p->n && p->s[p->i] == '-')
        p->i++;
    if (p->i < p->n && p->s[p->i] == '0') {
        p->i++;
    } else {
        if (p->i >= p->n || p->s[p->i] < '1' || p->s[p->i] > '9')
            return 0;
        while (p->i < p->n && p->s[p->i] >= '0' && p->s[p->i] <= '9')
            p->i++;
    }
    if (p->i < p->n && p->s[p->i] == '.') {
        p->i++;
        if (p->i >= p->n || p->s[p->i] < '0' || p->s[p->i] > '9')
            return 0;
        while (p->i < p->n && p->s[p->i] >= '0' && p->s[p->i] <= '9')
            p->i++;
    }
    if (p->i < p->n && (p->s[p->i] == 'e' || p->s[p->i] == 'E')) {
        p->i++;
        if (p->i < p->n && (p->s[p->i] == '+' || p->s[p->i] == '-'))
            p->i++;
        if (p->i >= p->n || p->s[p->i] < '0' || p->s[p->i] > '9')
            return 0;
        while (p->i < p->n && p->s[p->i] >= '0' && p->s[p->i] <= '9')
            p->i++;
    }
    return p->i > start;
}

static int jvalue(jp *p)
{
    jws(p);
    if (p->i >= p->n || ++p->depth > 64)
        return 0;
    int ok = 0;
    char c = p->s[p->i];
    if (c == '{' || c == '[') {
        char close = c == '{' ? '}' : ']';
        p->i++;
        jws(p);
        if (p->i < p->n && p->s[p->i] == close) {
            p->i++;
            ok = 1;
        } else {
            for (;;) {
                if (c == '{') {
                    jws(p);
                    if (!jstring(p))
                        break;
                    jws(p);
                    if (p->i >= p->n || p->s[p->i] != ':')
                        break;
                    p->i++;
                }
                if (!jvalue(p))
                    break;
                jws(p);
                if (p->i < p->n && p->s[p->i] == ',') {
                    p->i++;
                    continue;
                }
                if (p->i < p->n && p->s[p->i] == close) {
                    p->i++;
                    ok = 1;
                }
                break;
            }
        }
    } else if (c == '"') {
        ok = jstring(p);
    } else if (c == 't') {
        ok = jlit(p, "true");
    } else if (c == 'f') {
        ok = jlit(p, "false");
    } else if (c == 'n') {
        ok = jlit(p, "null");
    } else {
        ok = jnumber(p);
    }
    p->depth--;
    return ok;
}

static void check_json(const char *s, size_t n)
{
    jp p = { .s = s, .n = n };
    if (!jvalue(&p))
        fail("JSON: not valid", s, n, p.i);
    jws(&p);
    if (p.i != n)
        fail("JSON: data after the document", s, n, p.i);
}

/* the tags html.c writes; anything else after '<' came from a trace */
static const char *const tags[] = {
    "!DOCTYPE html>", "html", "head", "meta", "title", "style", "script", "body", "header",
    "h1", "h2", "h3", "p", "main", "table", "thead", "tbody", "tr", "th", "td", "a", "span", "code",
    "div", "button", "label", "input", "section", "small", "dl", "dt", "dd", "figure",
    "figcaption", "svg", "line", "text", "polyline", "circle", "title", "article", "details",
    "summary", "b", "ol", "li", "br", NULL,
};

static void check_html(const char *s, size_t n)
{
    check_utf8(s, n, "HTML: invalid UTF-8");
    check_no_controls(s, n, "HTML: control byte");
    for (size_t i = 0; i < n; i++) {
        if (s[i] != '<')
            continue;
        size_t j = i + 1 + (i + 1 < n && s[i + 1] == '/');
        int known = 0;
        for (int k = 0; tags[k] && !known; k++) {
            size_t l = strlen(tags[k]);
            if (n - j >= l + 1 && memcmp(s + j, tags[k], l) == 0 &&
                (tags[k][l - 1] == '>' || strchr(" >/", s[j + l])))
                known = 1;
        }
        if (!known)
            fail("HTML: markup not written by html.c", s, n, i);
        /* the page's own CSS and script may hold '<' */
        const char *end = NULL;
        if (!strncmp(s + i, "<style>", 7))
            end = "</style>";
        else if (!strncmp(s + i, "<script>", 8))
            end = "</script>";
        if (end) {
            const char *e = memmem(s + i + 1, n - i - 1, end, strlen(end));
            if (!e)
                fail("HTML: unterminated style or script", s, n, i);
            i = (size_t)(e - s);
        }
    }
}

/* --gen-suppressions output must load as a suppressions file */
static void check_supp(const char *s, size_t n)
{
    check_no_controls(s, n, "suppressions: control byte");
    int fd = memfd_with("gen.supp", (const uint8_t *)s, n);
    char path[64], err[700];
    snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
    cs_suppressions *sp = cs_supp_load(path, err, sizeof err);
    close(fd);
    if (!sp) {
        fprintf(stderr, "fuzz_report: generated suppressions do not load: %s\n", err);
        fail("suppressions: rejected by the loader", s, n, 0);
    }
    cs_supp_free(sp);
}

/* ---- the target ---------------------------------------------------------- */

/* The report closes the ELF files its symbolizers opened when it ends
 * (cs_sym_cleanup). Linked with -Wl,--wrap=cs_sym_cleanup, the runs of one
 * input and of the next few hundred share them instead, as the traces of
 * one multi-process report do: reopening libpython's symbols for each of
 * the five runs of every input made the target ~10 times slower. */
void __real_cs_sym_cleanup(void);
void __wrap_cs_sym_cleanup(void) {}
static unsigned inputs;

enum { OUT_TEXT, OUT_JSON, OUT_HTML, OUT_SUPP };

static void run(int kind, char **flags, int nflags, char traces[][64], int ntraces)
{
    int out = memfd_create("out", MFD_CLOEXEC);
    if (out < 0)
        abort();
    char outpath[64];
    snprintf(outpath, sizeof outpath, "/proc/self/fd/%d", out);
    char *argv[16 + MAX_TRACES];
    int argc = 0;
    argv[argc++] = "-o";
    argv[argc++] = outpath;
    for (int i = 0; i < nflags; i++)
        argv[argc++] = flags[i];
    for (int i = 0; i < ntraces; i++)
        argv[argc++] = traces[i];
    argv[argc] = NULL;
    cs_cmd_report(argc, argv);
    size_t n;
    char *s = slurp(out, &n);
    close(out);
    switch (kind) {
    case OUT_TEXT:
        check_no_controls(s, n, "text: control byte");
        break;
    case OUT_JSON:
        check_json(s, n);
        break;
    case OUT_HTML:
        check_html(s, n);
        break;
    case OUT_SUPP:
        check_supp(s, n);
        break;
    }
    free(s);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (++inputs % 512 == 0)
        __real_cs_sym_cleanup();    /* forget made-up paths now and then */
    /* the optional suppressions file at the end */
    const uint8_t *supp = memmem(data, size, SUPP_MARK, strlen(SUPP_MARK));
    size_t tsize = supp ? (size_t)(supp - data) : size;
    int suppfd = -1;
    char supppath[64] = "";
    if (supp) {
        supp += strlen(SUPP_MARK);
        suppfd = memfd_with("supp", supp, size - (size_t)(supp - data));
        snprintf(supppath, sizeof supppath, "/proc/self/fd/%d", suppfd);
        /* a file the loader refuses ends the command (usage error, exit
         * 2): load it here, and give the command only one that loads */
        char err[700];
        cs_suppressions *sp = cs_supp_load(supppath, err, sizeof err);
        if (!sp)
            supp = NULL;
        cs_supp_free(sp);
    }

    /* split into traces */
    int fds[MAX_TRACES], n = 0;
    char paths[MAX_TRACES][64];
    size_t start = 0;
    for (size_t off = 8; n < MAX_TRACES - 1 && off + 8 <= tsize; off += 8)
        if (memcmp(data + off, "CAPSANTR", 8) == 0) {
            fds[n++] = memfd_with("trace", data + start, off - start);
            start = off;
        }
    fds[n++] = memfd_with("trace", data + start, tsize - start);
    for (int i = 0; i < n; i++)
        snprintf(paths[i], sizeof paths[i], "/proc/self/fd/%d", fds[i]);

    char *text[] = { "--suppressions", supppath };
    run(OUT_TEXT, text, supp ? 2 : 0, paths, n);
    char *text1[] = { "--max-findings", "1" };
    run(OUT_TEXT, text1, 2, paths, n);
    char *json[] = { "--format", "json", "--suppressions", supppath };
    run(OUT_JSON, json, supp ? 4 : 2, paths, n);
    char *html[] = { "--format=html", "--max-findings=2" };
    run(OUT_HTML, html, 2, paths, n);
    char *gen[] = { "--gen-suppressions" };
    run(OUT_SUPP, gen, 1, paths, n);

    for (int i = 0; i < n; i++)
        close(fds[i]);
    if (suppfd >= 0)
        close(suppfd);
    return 0;
}
