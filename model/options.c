/* CAPSAN_OPTIONS parsing, driven by options.inc so that the parser, the
 * defaults and the help text cannot drift apart. */
#include "options.h"

#include <errno.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

cs_options cs_opt;

enum { T_INT, T_BOOL, T_STR };

static const struct optdesc {
    const char *name;
    int type;
    const char *defstr;
    const char *valid;
    const char *help;
    size_t off;
} table[] = {
#define OPT(t, n, d, v, h) {#n, T_##t, #d, v, h, offsetof(cs_options, n)},
#include "options.inc"
#undef OPT
};
#define NOPTS (sizeof table / sizeof table[0])

/* An option's default as options.inc writes it, without a STR's quotes;
 * *n gets its length. */
static const char *default_text(const struct optdesc *d, int *n)
{
    const char *t = d->defstr;
    *n = (int)strlen(t);
    if (d->type == T_STR && *n >= 2 && t[0] == '"') {
        t++;
        *n -= 2;
    }
    return t;
}

/* one more line in err (messages are kept, not overwritten) */
static void complain(char *err, unsigned errlen, const char *fmt, ...)
{
    size_t n = strnlen(err, errlen);
    if (n && n + 1 < errlen)
        err[n++] = '\n';
    if (n + 1 >= errlen)
        return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err + n, errlen - n, fmt, ap);
    va_end(ap);
}

/* one of the |-separated words of choices */
static int is_choice(const char *choices, const char *v, size_t vlen)
{
    for (const char *c = choices; *c;) {
        size_t n = strcspn(c, "|");
        if (n == vlen && !memcmp(c, v, n))
            return 1;
        c += n + (c[n] == '|');
    }
    return 0;
}

static int set(const struct optdesc *d, const char *v, size_t vlen, const char *source, char *err,
               unsigned errlen)
{
    char *p = (char *)&cs_opt + d->off;
    char tmp[64];
    if (d->type == T_STR) {
        if (vlen >= 512) {
            complain(err, errlen, "capsan: option '%s' in %s is too long (511 bytes at most)",
                     d->name, source);
            return -1;
        }
        int dn;
        if (!vlen && (default_text(d, &dn), dn != 0)) {
            /* empty only where empty is the default (suppressions) */
            complain(err, errlen, "capsan: option '%s' in %s must not be empty", d->name, source);
            return -1;
        }
        if (*d->valid && !is_choice(d->valid, v, vlen)) {
            complain(err, errlen, "capsan: bad value '%.*s' for option '%s' in %s (one of %s)",
                     (int)vlen, v, d->name, source, d->valid);
            return -1;
        }
        memcpy(p, v, vlen);
        p[vlen] = 0;
        return 0;
    }
    if (vlen == 0 || vlen >= sizeof tmp)
        goto bad;
    memcpy(tmp, v, vlen);
    tmp[vlen] = 0;
    if (d->type == T_BOOL) {
        if (!strcmp(tmp, "1") || !strcmp(tmp, "true") || !strcmp(tmp, "yes"))
            *(int *)p = 1;
        else if (!strcmp(tmp, "0") || !strcmp(tmp, "false") || !strcmp(tmp, "no"))
            *(int *)p = 0;
        else
            goto bad;
        return 0;
    }
    char *end;
    errno = 0;
    long x = strtol(tmp, &end, 0);
    if (*end || errno)
        goto bad;
    if (*d->valid) {
        char *dots;
        long lo = strtol(d->valid, &dots, 10), hi = strtol(dots + 2, NULL, 10);
        if (x < lo || x > hi)
            goto bad;
    }
    *(long *)p = x;
    return 0;
bad:
    if (d->type == T_BOOL)
        complain(err, errlen, "capsan: bad value '%.*s' for option '%s' in %s (0 or 1)",
                 (int)vlen, v, d->name, source);
    else
        complain(err, errlen, "capsan: bad value '%.*s' for option '%s' in %s (a number in %s)",
                 (int)vlen, v, d->name, source, *d->valid ? d->valid : "the range of a long");
    return -1;
}

void cs_options_defaults(void)
{
    char err[8];
    for (size_t i = 0; i < NOPTS; i++) {
        int n;
        const char *d = default_text(&table[i], &n);
        set(&table[i], d, (size_t)n, "", err, sizeof err);
    }
}

const char *cs_option_default(const char *name)
{
    static char buf[NOPTS][64];
    for (size_t i = 0; i < NOPTS; i++)
        if (!strcmp(table[i].name, name)) {
            int n;
            const char *d = default_text(&table[i], &n);
            snprintf(buf[i], sizeof buf[i], "%.*s", n, d);
            return buf[i];
        }
    return NULL;
}

/* Edit distance between a key as typed and an option's name (both short:
 * no allocation, one row on the stack), capped at 9. */
static unsigned distance(const char *a, size_t na, const char *b)
{
    size_t nb = strlen(b);
    unsigned row[64];
    if (na >= 63 || nb >= 63)
        return 9;
    for (size_t j = 0; j <= nb; j++)
        row[j] = (unsigned)j;
    for (size_t i = 1; i <= na; i++) {
        unsigned diag = row[0];
        row[0] = (unsigned)i;
        for (size_t j = 1; j <= nb; j++) {
            unsigned up = row[j];
            unsigned best = diag + (a[i - 1] != b[j - 1]);
            if (up + 1 < best)
                best = up + 1;
            if (row[j - 1] + 1 < best)
                best = row[j - 1] + 1;
            row[j] = best;
            diag = up;
        }
    }
    return row[nb] > 9 ? 9 : row[nb];
}

/* The option a mistyped key most likely meant: within two edits, or a name
 * that contains the key or is contained in it ("verbose" -> verbosity),
 * else NULL */
static const char *nearest(const char *key, size_t klen)
{
    const char *best = NULL;
    unsigned bd = 3;
    for (size_t i = 0; i < NOPTS; i++) {
        const char *n = table[i].name;
        unsigned d = distance(key, klen, n);
        size_t nl = strlen(n);
        /* a long common start ("verbose" -> verbosity), a prefix either
         * way ("halt" -> halt_on_error) */
        size_t cp = 0;
        while (cp < klen && cp < nl && key[cp] == n[cp])
            cp++;
        if (cp >= 5 || (klen >= 4 && (cp == klen || cp == nl)))
            d = d < 2 ? d : 2;
        if (d < bd) {
            bd = d;
            best = n;
        }
    }
    return best;
}

int cs_options_parse(const char *s, const char *source, char *err, unsigned errlen)
{
    int rc = 0;
    if (errlen)
        err[0] = 0;
    while (s && *s) {
        size_t len = strcspn(s, ":,");
        const char *eq = memchr(s, '=', len);
        if (len) {
            size_t klen = eq ? (size_t)(eq - s) : len;
            const struct optdesc *d = NULL;
            for (size_t i = 0; i < NOPTS; i++)
                if (strlen(table[i].name) == klen && !memcmp(table[i].name, s, klen))
                    d = &table[i];
            if (!d) {
                const char *near = nearest(s, klen);
                if (near)
                    complain(err, errlen, "capsan: unknown option '%.*s' in %s: did you mean "
                             "'%s'? (capsan help-options lists them)", (int)klen, s, source,
                             near);
                else
                    complain(err, errlen, "capsan: unknown option '%.*s' in %s "
                             "(CAPSAN_OPTIONS=help=1 or capsan help-options lists them)",
                             (int)klen, s, source);
                rc = -1;
            } else if (!eq) {
                complain(err, errlen, "capsan: option '%s' in %s needs a value (%s=...)", d->name,
                         source, d->name);
                rc = -1;
            } else if (set(d, eq + 1, len - klen - 1, source, err, errlen) != 0) {
                rc = -1;
            }
        }
        s += len;
        if (*s)
            s++;
    }
    return rc;
}

void cs_options_help(int fd)
{
    static const char *const types[] = {"int", "bool", "string"};
    /* the columns as wide as their longest entry */
    int wname = 0, wdef = 2;
    for (size_t i = 0; i < NOPTS; i++) {
        int n, l = (int)strlen(table[i].name);
        default_text(&table[i], &n);
        wname = l > wname ? l : wname;
        wdef = n > wdef ? n : wdef;
    }
    for (size_t i = 0; i < NOPTS; i++) {
        const struct optdesc *d = &table[i];
        int n;
        const char *def = default_text(d, &n);
        char valid[64];
        snprintf(valid, sizeof valid, "%s%s%s", *d->valid ? "(" : "", d->valid,
                 *d->valid ? ") " : "");
        dprintf(fd, "  %-*s %-6s default %-*.*s %s%s\n", wname, d->name, types[d->type], wdef,
                n ? n : 2, n ? def : "\"\"", valid, d->help);
    }
}

void cs_options_format(char *buf, unsigned len)
{
    unsigned n = 0;
    buf[0] = 0;
    for (size_t i = 0; i < NOPTS && n < len; i++) {
        const char *p = (const char *)&cs_opt + table[i].off;
        int w;
        if (table[i].type == T_STR)
            w = snprintf(buf + n, len - n, "%s%s=%s", n ? ":" : "", table[i].name, p);
        else if (table[i].type == T_BOOL)
            w = snprintf(buf + n, len - n, "%s%s=%d", n ? ":" : "", table[i].name, *(const int *)p);
        else
            w = snprintf(buf + n, len - n, "%s%s=%ld", n ? ":" : "", table[i].name, *(const long *)p);
        if (w < 0)
            break;
        n += (unsigned)w;
    }
}
