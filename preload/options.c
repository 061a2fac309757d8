/* CAPSAN_OPTIONS parsing, driven by options.inc so that the parser, the
 * defaults and the help text cannot drift apart. */
#include "options.h"

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
    const char *help;
    size_t off;
} table[] = {
#define OPT(t, n, d, h) {#n, T_##t, #d, h, offsetof(cs_options, n)},
#include "options.inc"
#undef OPT
};
#define NOPTS (sizeof table / sizeof table[0])

static int set(const struct optdesc *d, const char *v, size_t vlen, char *err, unsigned errlen)
{
    char *p = (char *)&cs_opt + d->off;
    char tmp[64];
    if (d->type == T_STR) {
        if (vlen >= 512) {
            snprintf(err, errlen, "capsan: option '%s' is too long", d->name);
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
    long x = strtol(tmp, &end, 0);
    if (*end)
        goto bad;
    *(long *)p = x;
    return 0;
bad:
    snprintf(err, errlen, "capsan: bad value '%.*s' for option '%s' (%s expected)", (int)vlen, v,
             d->name, d->type == T_BOOL ? "0 or 1" : "a number");
    return -1;
}

void cs_options_defaults(void)
{
    char err[8];
    for (size_t i = 0; i < NOPTS; i++) {
        const char *d = table[i].defstr;
        size_t n = strlen(d);
        if (table[i].type == T_STR && n >= 2 && d[0] == '"') { /* strip the quotes */
            d++;
            n -= 2;
        }
        set(&table[i], d, n, err, sizeof err);
    }
}

int cs_options_parse(const char *s, char *err, unsigned errlen)
{
    int rc = 0;
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
                snprintf(err, errlen, "capsan: unknown option '%.*s' in CAPSAN_OPTIONS "
                         "(CAPSAN_OPTIONS=help=1 lists them)", (int)klen, s);
                rc = -1;
            } else if (!eq) {
                snprintf(err, errlen, "capsan: option '%s' needs a value (%s=...)", d->name,
                         d->name);
                rc = -1;
            } else if (set(d, eq + 1, len - klen - 1, err, errlen) != 0) {
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
    dprintf(fd, "capsan options (CAPSAN_OPTIONS=key=value:key=value):\n");
    for (size_t i = 0; i < NOPTS; i++)
        dprintf(fd, "  %-14s default %-14s %s\n", table[i].name, table[i].defstr, table[i].help);
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
