/* Module file + offset symbolization (pathsym.h). */
#include "pathsym.h"
#include "reader.h"
#include "symbolize.h"
#include "util.h"

#include <stdlib.h>
#include <string.h>

/* A symbolizer of its own for each module, which sees it loaded at 0: an
 * offset is then its address, for a shared object (offsets from the load
 * bias) as for a fixed-address executable (absolute addresses, bias 0). */
typedef struct pmod {
    cs_module_rec rec;
    cs_symbolizer *sym;       /* made at the first lookup */
} pmod;

struct cs_pathsym {
    pmod **mods;              /* one allocation each: the symbolizer keeps &rec */
    size_t nmods, cap;
};

cs_pathsym *cs_pathsym_create(void) { return cs_xcalloc(1, sizeof(cs_pathsym)); }

void cs_pathsym_destroy(cs_pathsym *ps)
{
    if (!ps)
        return;
    for (size_t i = 0; i < ps->nmods; i++) {
        cs_sym_destroy(ps->mods[i]->sym);
        free(ps->mods[i]->rec.path);
        free(ps->mods[i]->rec.build_id);
        free(ps->mods[i]);
    }
    free(ps->mods);
    free(ps);
}

static int hex_digit(char c)
{
    return c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10
         : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
}

size_t cs_pathsym_module(cs_pathsym *ps, const char *path, const char *build_id)
{
    if (!path || path[0] != '/')
        return 0;                     /* the vdso, a name as run: nothing on disk */
    uint8_t id[64];
    size_t hl = build_id ? strlen(build_id) : 0, idlen = 0;
    if (hl % 2 == 0 && hl <= 2 * sizeof id)
        for (idlen = 0; idlen < hl / 2; idlen++) {
            int hi = hex_digit(build_id[2 * idlen]), lo = hex_digit(build_id[2 * idlen + 1]);
            if (hi < 0 || lo < 0) {
                idlen = 0;
                break;
            }
            id[idlen] = (uint8_t)(hi << 4 | lo);
        }
    for (size_t i = 0; i < ps->nmods; i++) {
        const cs_module_rec *m = &ps->mods[i]->rec;
        if (strcmp(m->path, path) == 0 && m->build_id_len == idlen &&
            (!idlen || !memcmp(m->build_id, id, idlen)))
            return i + 1;
    }
    if (ps->nmods == ps->cap) {
        ps->cap = ps->cap ? ps->cap * 2 : 16;
        ps->mods = cs_xrealloc(ps->mods, ps->cap * sizeof *ps->mods);
    }
    pmod *m = cs_xcalloc(1, sizeof *m);
    m->rec.hi = UINT64_MAX;
    m->rec.path = cs_xstrndup(path, strlen(path));
    if (idlen) {
        m->rec.build_id = cs_xcalloc(idlen, 1);
        memcpy(m->rec.build_id, id, idlen);
        m->rec.build_id_len = (uint32_t)idlen;
    }
    ps->mods[ps->nmods++] = m;
    return ps->nmods;
}

int cs_pathsym_native(cs_pathsym *ps, size_t module, uint64_t offset, cs_frame_info *out, int max)
{
    if (!module || module > ps->nmods || max <= 0)
        return 0;
    pmod *m = ps->mods[module - 1];
    if (!m->sym)
        m->sym = cs_sym_create(&m->rec, 1, NULL);
    int n = cs_sym_native(m->sym, offset, out, max);
    return n > 0 && (out[n - 1].function || out[n - 1].file) ? n : 0;
}
