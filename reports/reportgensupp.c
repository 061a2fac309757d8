/* `capsan report --gen-suppressions`: a KIND:pattern line per finding,
 * each distinct line printed once (a set of the lines so far), with a
 * comment saying which finding it is for. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "report_int.h"
#include "util.h"
#include "render.h"
#include "suppress.h"

static uint64_t hash_str(const char *s)
{
    uint64_t h = 1469598103934665603ull;
    for (; *s; s++)
        h = (h ^ (unsigned char)*s) * 1099511628211ull;
    return h;
}

/* ---- --gen-suppressions --------------------------------------------------------- */

/* 1 when line is new (and now remembered) */
static int line_add(report_ctx *c, const char *line)
{
    if ((c->ln + 1) * 2 > c->lcap) {
        size_t ncap = c->lcap ? c->lcap * 2 : 64;
        char **n = cs_xcalloc(ncap, sizeof *n);
        for (size_t i = 0; i < c->lcap; i++) {
            if (!c->lines[i])
                continue;
            size_t j = hash_str(c->lines[i]) & (ncap - 1);
            while (n[j])
                j = (j + 1) & (ncap - 1);
            n[j] = c->lines[i];
        }
        free(c->lines);
        c->lines = n;
        c->lcap = ncap;
    }
    size_t j = hash_str(line) & (c->lcap - 1);
    while (c->lines[j]) {
        if (strcmp(c->lines[j], line) == 0)
            return 0;
        j = (j + 1) & (c->lcap - 1);
    }
    if (!(c->lines[j] = strdup(line))) {
        fputs("capsan: out of memory\n", stderr);
        exit(1);
    }
    c->ln++;
    return 1;
}

void report_gen_suppression(report_ctx *c, const cs_finding *f)
{
    char line[1024], msg[512];
    c->gen_findings++;
    cs_finding_message(f, msg, sizeof msg);
    /* the comment says what the line is for: keep it on one line */
    for (char *s = msg; *s; s++)
        if ((unsigned char)*s < 0x20)
            *s = ' ';
    if (!cs_supp_generate(f, &c->src, line, sizeof line)) {
        c->gen_unnamed++;
        cs_outf(c->out, "# %s (pid %llu): no stack frame to name; not suppressible by pattern\n",
                cs_kind_name(f->kind), (unsigned long long)c->pi.pid);
        return;
    }
    if (!line_add(c, line))
        return;
    cs_outf(c->out, "# %s (pid %llu)\n", msg, (unsigned long long)c->pi.pid);
    cs_outf(c->out, "%s\n", line);
}
