/* The OPTIONS record, as the runtime was configured: protect (which the
 * replay must judge with, as the runtime did), suppressions,
 * max_findings and strip_path_prefix for the report. */
#include "reader_int.h"
#include "util.h"

#include <stdlib.h>
#include <string.h>

/* The value of key in a k=v:k=v string (the last setting wins), or NULL. */
static const char *option_value(const char *opts, const char *key, size_t *len)
{
    const char *found = NULL;
    size_t kl = strlen(key);
    for (const char *o = opts; o && *o;) {
        size_t n = strcspn(o, ":");
        if (n > kl && !strncmp(o, key, kl) && o[kl] == '=') {
            found = o + kl + 1;
            *len = n - kl - 1;
        }
        o += n;
        if (*o)
            o++;
    }
    return found;
}

void trace_apply_options(cs_trace *t)
{
    struct cs_trace_priv *p = t->priv;
    size_t n = 0;
    const char *v = option_value(t->options, "protect", &n);
    int protect = v && ((n == 1 && *v == '1') || (n == 4 && !strncmp(v, "true", 4)) ||
                        (n == 3 && !strncmp(v, "yes", 3)));
    if (protect != p->protect) {
        /* the runtime's protect decides whether skipped calls changed
         * state: replay must judge as the runtime did */
        p->protect = protect;
        if (p->lc)
            cs_lc_set_protect(p->lc, protect);
        if (p->judged)
            p->rereplay = 1;
    }
    free(t->opt_suppressions);
    t->opt_suppressions = NULL;
    if ((v = option_value(t->options, "suppressions", &n)) && n)
        t->opt_suppressions = cs_xstrndup(v, n);
    free(t->opt_strip_prefix);
    t->opt_strip_prefix = NULL;
    if ((v = option_value(t->options, "strip_path_prefix", &n)) && n)
        t->opt_strip_prefix = cs_xstrndup(v, n);
    t->opt_max_findings = -1;
    if ((v = option_value(t->options, "max_findings", &n)) && n && n < 20) {
        char buf[24];
        memcpy(buf, v, n);
        buf[n] = 0;
        char *end;
        long x = strtol(buf, &end, 0);
        if (!*end && x >= 0)
            t->opt_max_findings = x;
    }
}
