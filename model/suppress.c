/* Suppressions (suppress.h): LeakSanitizer's file syntax and matching
 * rules, so a team's habits and files carry over. Written for the report
 * tool: it may allocate and use stdio. */
#include "suppress.h"

#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "alloc.h"

#define KIND_ANY (-1)
#define KIND_LEAKS (-2)
#define SUPP_MAX_FRAMES 128

typedef struct rule {
    int kind;                 /* cs_kind, KIND_ANY or KIND_LEAKS */
    char *text;               /* the line as written, for "Suppressions used" */
    char *pattern;
    unsigned hits;
    uint64_t bytes;
} rule;

struct cs_suppressions {
    rule *rules;
    size_t n;
};

/* '*' globbing over p[0..pn), anchored at s; trail lets the pattern end
 * before the string does. */
static int match_at(const char *p, size_t pn, const char *s, int trail)
{
    size_t pi = 0, star = (size_t)-1;
    const char *star_s = NULL;
    while (*s) {
        if (pi == pn && trail)
            return 1;
        if (pi < pn && p[pi] == '*') {
            star = ++pi;
            star_s = s;
            continue;
        }
        if (pi < pn && p[pi] == *s) {
            pi++;
            s++;
            continue;
        }
        if (star != (size_t)-1) {
            pi = star;
            s = ++star_s;
            continue;
        }
        return 0;
    }
    while (pi < pn && p[pi] == '*')
        pi++;
    return pi == pn;
}

int cs_supp_pattern_match(const char *pattern, const char *name)
{
    if (!pattern || !name)
        return 0;
    int start = pattern[0] == '^';
    if (start)
        pattern++;
    size_t pn = strlen(pattern);
    int end = pn && pattern[pn - 1] == '$';
    if (end)
        pn--;
    if (start)
        return match_at(pattern, pn, name, !end);
    for (const char *s = name;; s++) {
        if (match_at(pattern, pn, s, !end))
            return 1;
        if (!*s)
            return 0;
    }
}

static char *trim(char *s)
{
    while (isspace((unsigned char)*s))
        s++;
    size_t n = strlen(s);
    while (n && isspace((unsigned char)s[n - 1]))
        s[--n] = 0;
    return s;
}

static int is_leak_kind(int kind)
{
    const char *name = cs_kind_name(kind);
    size_t n = name ? strlen(name) : 0;
    return n >= 5 && strcmp(name + n - 5, "-leak") == 0;
}

cs_suppressions *cs_supp_load(const char *path, char *err, size_t errlen)
{
    FILE *f = fopen(path, "r");
    if (!f) {
        snprintf(err, errlen, "%s: cannot open suppressions: %s", path, strerror(errno));
        return NULL;
    }
    /* a directory opens, then reads as an error: say so (a pipe, as from
     * <(...), is fine) */
    struct stat st;
    if (fstat(fileno(f), &st) == 0 && S_ISDIR(st.st_mode)) {
        snprintf(err, errlen, "%s: is a directory, not a suppressions file", path);
        fclose(f);
        return NULL;
    }
    cs_suppressions *s = cs_calloc(1, sizeof *s);
    size_t cap = 0;
    char *line = NULL;
    size_t linecap = 0;
    unsigned lineno = 0;
    int ok = s != NULL;
    while (ok && getline(&line, &linecap, f) >= 0) {
        lineno++;
        char *hash = strchr(line, '#');
        if (hash)
            *hash = 0;
        char *l = trim(line);
        if (!*l)
            continue;
        char *colon = strchr(l, ':');
        if (!colon) {
            snprintf(err, errlen, "%s:%u: expected KIND:pattern, got '%s'", path, lineno, l);
            ok = 0;
            break;
        }
        *colon = 0;
        char *kname = trim(l), *pat = trim(colon + 1);
        int kind;
        if (strcmp(kname, "*") == 0)
            kind = KIND_ANY;
        else if (strcmp(kname, "leak") == 0)
            kind = KIND_LEAKS;
        else if ((kind = cs_kind_from_name(kname)) == CS_KIND_NONE) {
            snprintf(err, errlen, "%s:%u: unknown finding kind '%s' "
                     "(a kind name, 'leak' or '*')", path, lineno, kname);
            ok = 0;
            break;
        }
        if (!*pat) {
            snprintf(err, errlen, "%s:%u: empty pattern (use '*' to match everything)",
                     path, lineno);
            ok = 0;
            break;
        }
        if (s->n == cap) {
            cap = cap ? cap * 2 : 16;
            rule *r = cs_realloc(s->rules, cap * sizeof *r);
            if (!r) {
                snprintf(err, errlen, "%s: out of memory", path);
                ok = 0;
                break;
            }
            s->rules = r;
        }
        rule *r = &s->rules[s->n];
        memset(r, 0, sizeof *r);
        r->kind = kind;
        r->pattern = cs_strdup(pat);
        size_t tl = strlen(kname) + 1 + strlen(pat) + 1;
        r->text = cs_malloc(tl);
        if (!r->pattern || !r->text) {
            cs_free(r->pattern);
            cs_free(r->text);
            snprintf(err, errlen, "%s: out of memory", path);
            ok = 0;
            break;
        }
        snprintf(r->text, tl, "%s:%s", kname, pat);
        s->n++;
    }
    if (ok && ferror(f)) {
        snprintf(err, errlen, "%s: cannot read suppressions: %s", path, strerror(errno));
        ok = 0;
    }
    free(line); /* getline's: malloc's */
    fclose(f);
    if (!ok) {
        if (!s)
            snprintf(err, errlen, "%s: out of memory", path);
        cs_supp_free(s);
        return NULL;
    }
    return s;
}

void cs_supp_free(cs_suppressions *s)
{
    if (!s)
        return;
    for (size_t i = 0; i < s->n; i++) {
        cs_free(s->rules[i].pattern);
        cs_free(s->rules[i].text);
    }
    cs_free(s->rules);
    cs_free(s);
}

static int rule_applies(const rule *r, int kind)
{
    return r->kind == KIND_ANY || r->kind == kind || (r->kind == KIND_LEAKS && is_leak_kind(kind));
}

static int frame_matches(const char *pat, const cs_frame_info *fr)
{
    const char *base = fr->module ? strrchr(fr->module, '/') : NULL;
    return cs_supp_pattern_match(pat, fr->function) ||
           cs_supp_pattern_match(pat, fr->file) ||
           cs_supp_pattern_match(pat, fr->module) ||
           (base && cs_supp_pattern_match(pat, base + 1));
}

int cs_supp_match(cs_suppressions *s, const cs_finding *f, const cs_stack_source *src)
{
    if (!s || !s->n)
        return 0;
    int any = 0;
    for (size_t i = 0; i < s->n; i++)
        any |= rule_applies(&s->rules[i], f->kind);
    if (!any)
        return 0;
    int nev = f->nevents < CS_FINDING_MAX_EVENTS ? f->nevents : CS_FINDING_MAX_EVENTS;
    for (int e = 0; e < nev; e++) {
        cs_frame_info frames[SUPP_MAX_FRAMES];
        int n = cs_stack_frames(src, f->events[e].stack, frames, SUPP_MAX_FRAMES);
        for (size_t i = 0; i < s->n; i++) {
            rule *r = &s->rules[i];
            if (!rule_applies(r, f->kind))
                continue;
            for (int k = 0; k < n; k++)
                if (frame_matches(r->pattern, &frames[k])) {
                    r->hits++;
                    r->bytes += f->bytes;
                    return 1;
                }
        }
    }
    return 0;
}

void cs_supp_render_used(const cs_suppressions *s, cs_out *o)
{
    int any = 0;
    for (size_t i = 0; s && i < s->n; i++) {
        const rule *r = &s->rules[i];
        if (!r->hits)
            continue;
        if (!any)
            cs_outf(o, "Suppressions used:\n  count      bytes template\n");
        any = 1;
        cs_outf(o, "  %5u %10llu %s\n", r->hits, (unsigned long long)r->bytes, r->text);
    }
    if (any)
        cs_outf(o, "\n");
}

/* ---- --gen-suppressions ------------------------------------------------ */

static int has_prefix(const char *s, const char *p)
{
    return s && strncmp(s, p, strlen(p)) == 0;
}

static const char *base_name(const char *path)
{
    const char *slash = path ? strrchr(path, '/') : NULL;
    return slash ? slash + 1 : path ? path : "";
}

/* Frames every stack goes through: the interpreter (python3.11, libpython),
 * the standard library, capsan's own. Naming one suppresses everything. */
static int infrastructure(const cs_frame_info *fr)
{
    if (fr->python) {
        const char *f = fr->file;
        return !f || !*f || f[0] == '<' || /* <frozen ...>, <string> */
               (strstr(f, "/lib/python3") && !strstr(f, "-packages/")) ||
               strstr(f, "/capsan/");
    }
    const char *b = base_name(fr->module);
    return !*b || has_prefix(b, "python") || has_prefix(b, "libpython") ||
           has_prefix(b, "libcapsan") || has_prefix(b, "libc.so") || has_prefix(b, "ld-linux") ||
           has_prefix(b, "libstdc++") || has_prefix(b, "libgcc_s");
}

/* Not the program's own: an installed library (site-packages, the
 * system's trees). Shared by every program that uses it, so a frame of
 * the program's own comes first when there is one. */
static int installed(const cs_frame_info *fr)
{
    const char *p = fr->python ? fr->file : fr->module;
    return !p || strstr(p, "/site-packages/") || strstr(p, "/dist-packages/") ||
           has_prefix(p, "/usr/") || has_prefix(p, "/lib") || has_prefix(p, "/opt/conda");
}

/* copy s into the pattern, turning what the suppression syntax would read
 * as a comment, a line break or an anchor into '*' */
static size_t put_pattern(char *buf, size_t n, size_t at, const char *s)
{
    for (; s && *s && at + 1 < n; s++) {
        unsigned char c = (unsigned char)*s;
        buf[at++] = (c == '#' || c < 0x20 || c == 0x7f || c == '^' || c == '$') ? '*' : (char)c;
    }
    buf[at < n ? at : n - 1] = 0;
    return at;
}

/* The pattern for one frame: a function by its whole name (^name$: the
 * most specific pattern that still matches every occurrence), else the
 * file or module by its last component (/name$: wherever the program is
 * checked out). A Python frame's <module> or <lambda> names nothing. */
static size_t frame_pattern(const cs_frame_info *fr, char *buf, size_t n, size_t at)
{
    const char *fn = fr->function;
    if (fn && *fn && fn[0] != '<' && !(fr->python && strchr(fn, '<'))) {
        if (at + 1 < n)
            buf[at++] = '^';
        at = put_pattern(buf, n, at, fn);
    } else {
        const char *path = fr->python ? fr->file : fr->module;
        at = put_pattern(buf, n, at, "/");
        at = put_pattern(buf, n, at, base_name(path));
    }
    if (at + 1 < n)
        buf[at++] = '$';
    buf[at < n ? at : n - 1] = 0;
    return at;
}

size_t cs_supp_generate(const cs_finding *f, const cs_stack_source *src, char *buf, size_t n)
{
    if (!n)
        return 0;
    buf[0] = 0;
    int nev = f->nevents < CS_FINDING_MAX_EVENTS ? f->nevents : CS_FINDING_MAX_EVENTS;
    if (!nev || !src)
        return 0;
    const cs_event *ev = &f->events[is_leak_kind(f->kind) ? 0 : nev - 1];
    cs_frame_info frames[SUPP_MAX_FRAMES];
    int nf = cs_stack_frames(src, ev->stack, frames, SUPP_MAX_FRAMES);
    /* the innermost frame that is the program's own, else the innermost
     * that is not the interpreter's, the standard library's or capsan's */
    const cs_frame_info *pick = NULL;
    for (int pass = 0; pass < 2 && !pick; pass++)
        for (int k = 0; k < nf && !pick; k++) {
            const cs_frame_info *fr = &frames[k];
            int named = fr->python ? fr->file && *fr->file
                                   : (fr->function && *fr->function) ||
                                         (fr->module && *fr->module);
            if (named && !infrastructure(fr) && (pass || !installed(fr)))
                pick = fr;
        }
    if (!pick)
        return 0;
    size_t at = put_pattern(buf, n, 0, cs_kind_name(f->kind));
    at = put_pattern(buf, n, at, ":");
    at = frame_pattern(pick, buf, n, at);
    return at < n ? at : n - 1;
}
