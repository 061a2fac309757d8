/* Finding kinds (kinds.inc): their names, severities and help, below every
 * text that names them (findtext.c, arrowtext.c, json.c, render.c). */
#include "lifecycle.h"

#include <string.h>

static const struct {
    const char *name;
    int sev;
    const char *help;
} kinds[CS_KIND_COUNT] = {
    [CS_KIND_NONE] = {"none", 0, ""},
#define KIND(e, n, s, h) [CS_KIND_##e] = {n, s, h},
#include "kinds.inc"
#undef KIND
};

const char *cs_kind_name(int k) { return k > 0 && k < CS_KIND_COUNT ? kinds[k].name : "unknown"; }
int cs_kind_severity(int k) { return k > 0 && k < CS_KIND_COUNT ? kinds[k].sev : 0; }
const char *cs_kind_help(int k) { return k > 0 && k < CS_KIND_COUNT ? kinds[k].help : ""; }

int cs_finding_severity(const cs_finding *f)
{
    if ((f->kind == CS_KIND_DLPACK_LEAK || f->kind == CS_KIND_NUMPY_LEAK ||
         f->kind == CS_KIND_ARROW_LEAK) &&
        f->detail == CS_LEAK_KILLED)
        return CS_SEV_WARNING;
    /* a view kept past its call: its later read is not seen (R53) */
    if (f->kind == CS_KIND_DLPACK_STALE_VIEW && (f->detail & CS_FREED_KEPT))
        return CS_SEV_WARNING;
    return cs_kind_severity(f->kind);
}

int cs_kind_from_name(const char *name)
{
    for (int k = 1; k < CS_KIND_COUNT; k++)
        if (strcmp(kinds[k].name, name) == 0)
            return k;
    return CS_KIND_NONE;
}
