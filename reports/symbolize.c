/* Offline symbolizer (see symbolize.h). One Dwfl per module, opened on
 * first use: reporting all modules into one Dwfl would fail as soon as two
 * records overlap (a library unloaded and another loaded at its address),
 * and most traces only ever touch a handful of the modules they list.
 * Opened modules are shared by every symbolizer of the process, keyed by
 * path and build id: a report of many processes (multiprocessing workers
 * all running the same interpreter and libraries) reads each file's DWARF
 * once. A module loaded at another bias is looked up at the first one's,
 * shifted by the difference. */
#include "symbolize.h"
#include "util.h"

#include <dlfcn.h>
#include <elfutils/libdw.h>
#include <elfutils/libdwfl.h>
#include <dwarf.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#define SYM_MAX_FRAMES 16     /* inline depth kept per address */

enum { MOD_UNTRIED = 0, MOD_OK = 1, MOD_FAILED = -1 };

/* an ELF file opened for lookups, shared by all symbolizers */
typedef struct shared_mod {
    char *path;
    uint8_t *build_id;
    uint32_t build_id_len;
    uint64_t base;            /* the bias it was reported at */
    int ok;
    Dwfl *dwfl;
    Dwfl_Module *mod;
} shared_mod;

static shared_mod *shared;
static size_t nshared, shared_cap;

typedef struct sym_mod {
    const cs_module_rec *rec;
    int state;
    Dwfl_Module *mod;
    uint64_t delta;           /* rec->base - the shared module's base */
    const char *path;         /* interned; the exe for an empty path */
    const char *build_id;     /* interned hex, or NULL */
} sym_mod;

typedef struct cache_ent {
    uint64_t ip;
    uint32_t used;
    uint32_t n;               /* frames at pool[first..first+n) */
    size_t first;
} cache_ent;

struct cs_symbolizer {
    sym_mod *mods;
    size_t nmods;
    const char *exe;
    /* address cache */
    cache_ent *cache;
    size_t cache_cap, cache_n;
    cs_frame_info *pool;
    size_t pool_n, pool_cap;
    /* interned strings: pointers handed out stay valid until destroy */
    char **strs;
    size_t strs_cap, strs_n;
    /* __cxa_demangle, found lazily in libstdc++ if it is there */
    int demangle_tried;
    char *(*demangle)(const char *, char *, size_t *, int *);
};



static uint64_t hash_bytes(const char *s, size_t n)
{
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++)
        h = (h ^ (unsigned char)s[i]) * 1099511628211ull;
    return h;
}



static const char *intern(cs_symbolizer *s, const char *str)
{
    if (!str)
        return NULL;
    size_t len = strlen(str);
    if ((s->strs_n + 1) * 2 > s->strs_cap) {
        size_t ncap = s->strs_cap ? s->strs_cap * 2 : 256;
        char **n = cs_xrealloc(NULL, ncap * sizeof *n);
        memset(n, 0, ncap * sizeof *n);
        for (size_t i = 0; i < s->strs_cap; i++) {
            if (!s->strs[i])
                continue;
            size_t j = hash_bytes(s->strs[i], strlen(s->strs[i])) & (ncap - 1);
            while (n[j])
                j = (j + 1) & (ncap - 1);
            n[j] = s->strs[i];
        }
        free(s->strs);
        s->strs = n;
        s->strs_cap = ncap;
    }
    size_t j = hash_bytes(str, len) & (s->strs_cap - 1);
    while (s->strs[j]) {
        if (strcmp(s->strs[j], str) == 0)
            return s->strs[j];
        j = (j + 1) & (s->strs_cap - 1);
    }
    s->strs[j] = cs_xrealloc(NULL, len + 1);
    memcpy(s->strs[j], str, len + 1);
    s->strs_n++;
    return s->strs[j];
}

/* C++ names read better demangled; libstdc++ is found at run time so the
 * tool neither links it nor fails without it. */
static const char *pretty_name(cs_symbolizer *s, const char *name)
{
    if (!name)
        return NULL;
    if (name[0] != '_' || name[1] != 'Z')
        return intern(s, name);
    if (!s->demangle_tried) {
        s->demangle_tried = 1;
        void *h = dlopen("libstdc++.so.6", RTLD_LAZY | RTLD_LOCAL);
        if (h)
            *(void **)&s->demangle = dlsym(h, "__cxa_demangle");
    }
    if (s->demangle) {
        int status = -1;
        char *d = s->demangle(name, NULL, NULL, &status);
        if (d && status == 0) {
            const char *r = intern(s, d);
            free(d);
            return r;
        }
        free(d);
    }
    return intern(s, name);
}

cs_symbolizer *cs_sym_create(const cs_module_rec *modules, size_t nmodules, const char *exe)
{
    cs_symbolizer *s = cs_xrealloc(NULL, sizeof *s);
    memset(s, 0, sizeof *s);
    s->nmods = nmodules;
    s->mods = cs_xrealloc(NULL, (nmodules ? nmodules : 1) * sizeof *s->mods);
    memset(s->mods, 0, (nmodules ? nmodules : 1) * sizeof *s->mods);
    s->exe = exe && *exe ? intern(s, exe) : NULL;
    for (size_t i = 0; i < nmodules; i++) {
        sym_mod *m = &s->mods[i];
        m->rec = &modules[i];
        m->path = modules[i].path && *modules[i].path ? intern(s, modules[i].path) : s->exe;
        if (modules[i].build_id_len) {
            /* hex of at most 64 bytes: build ids are 20 (sha1) or 16 (md5) */
            char hex[129];
            uint32_t n = modules[i].build_id_len > 64 ? 64 : modules[i].build_id_len;
            for (uint32_t k = 0; k < n; k++)
                snprintf(hex + 2 * k, 3, "%02x", modules[i].build_id[k]);
            hex[2 * n] = 0;
            m->build_id = intern(s, hex);
        }
    }
    return s;
}

void cs_sym_destroy(cs_symbolizer *s)
{
    if (!s)
        return;
    free(s->mods);
    free(s->cache);
    free(s->pool);
    for (size_t i = 0; i < s->strs_cap; i++)
        free(s->strs[i]);
    free(s->strs);
    free(s);
}

static char *debuginfo_path;  /* NULL: libdwfl's default search path */
static const Dwfl_Callbacks offline_callbacks = {
    .find_elf = dwfl_build_id_find_elf,
    .find_debuginfo = dwfl_standard_find_debuginfo,
    .section_address = dwfl_offline_section_address,
    .debuginfo_path = &debuginfo_path,
};

/* Opens path at bias base; refuses a file whose build id differs from the
 * recorded one (the library was replaced since the trace was written: its
 * symbols would be plausible and wrong). */
static int open_elf(shared_mod *sm)
{
    /* a trace names any path: only a regular file is opened (a FIFO
     * would block the report forever) */
    struct stat st;
    if (stat(sm->path, &st) != 0 || !S_ISREG(st.st_mode))
        return 0;
    Dwfl *d = dwfl_begin(&offline_callbacks);
    if (!d)
        return 0;
    dwfl_report_begin(d);
    const char *slash = strrchr(sm->path, '/');
    /* add_p_vaddr: base is the load bias, as dl_iterate_phdr's dlpi_addr */
    Dwfl_Module *mod = dwfl_report_elf(d, slash + 1, sm->path, -1, sm->base, true);
    if (dwfl_report_end(d, NULL, NULL) != 0 || !mod) {
        dwfl_end(d);
        return 0;
    }
    if (sm->build_id_len) {
        const unsigned char *bits = NULL;
        GElf_Addr vaddr;
        int n = dwfl_module_build_id(mod, &bits, &vaddr);
        if (n > 0 && ((uint32_t)n != sm->build_id_len ||
                      memcmp(bits, sm->build_id, (size_t)n) != 0)) {
            dwfl_end(d);
            return 0;
        }
    }
    sm->dwfl = d;
    sm->mod = mod;
    return 1;
}

static int open_module(sym_mod *m)
{
    if (m->state != MOD_UNTRIED)
        return m->state == MOD_OK;
    m->state = MOD_FAILED;
    if (!m->path || m->path[0] != '/')
        return 0;                   /* the vdso, or nothing on disk */
    const cs_module_rec *r = m->rec;
    shared_mod *sm = NULL;
    for (size_t i = 0; i < nshared && !sm; i++)
        if (shared[i].build_id_len == r->build_id_len && strcmp(shared[i].path, m->path) == 0 &&
            (!r->build_id_len || memcmp(shared[i].build_id, r->build_id, r->build_id_len) == 0))
            sm = &shared[i];
    if (!sm) {
        if (nshared == shared_cap) {
            shared_cap = shared_cap ? shared_cap * 2 : 64;
            shared = cs_xrealloc(shared, shared_cap * sizeof *shared);
        }
        sm = &shared[nshared++];
        memset(sm, 0, sizeof *sm);
        sm->path = cs_xrealloc(NULL, strlen(m->path) + 1);
        strcpy(sm->path, m->path);
        sm->build_id_len = r->build_id_len;
        if (r->build_id_len) {
            sm->build_id = cs_xrealloc(NULL, r->build_id_len);
            memcpy(sm->build_id, r->build_id, r->build_id_len);
        }
        sm->base = r->base;
        sm->ok = open_elf(sm);
    }
    if (!sm->ok)
        return 0;
    m->mod = sm->mod;
    m->delta = r->base - sm->base;
    m->state = MOD_OK;
    return 1;
}

void cs_sym_cleanup(void)
{
    for (size_t i = 0; i < nshared; i++) {
        if (shared[i].dwfl)
            dwfl_end(shared[i].dwfl);
        free(shared[i].path);
        free(shared[i].build_id);
    }
    free(shared);
    shared = NULL;
    nshared = shared_cap = 0;
}

static sym_mod *find_module(cs_symbolizer *s, uint64_t ip)
{
    for (size_t i = s->nmods; i-- > 0;)
        if (ip >= s->mods[i].rec->lo && ip < s->mods[i].rec->hi)
            return &s->mods[i];
    return NULL;
}

static const char *die_name(cs_symbolizer *s, Dwarf_Die *die)
{
    Dwarf_Attribute a;
    const char *n = NULL;
    if (dwarf_attr_integrate(die, DW_AT_linkage_name, &a) ||
        dwarf_attr_integrate(die, DW_AT_MIPS_linkage_name, &a))
        n = dwarf_formstring(&a);
    if (!n)
        n = dwarf_diename(die);
    return pretty_name(s, n);
}

/* The call site of an inlined subroutine, in its own unit's file table. */
static void call_site(cs_symbolizer *s, Dwarf_Die *die, const char **file, uint32_t *line)
{
    Dwarf_Attribute a;
    Dwarf_Word w;
    *file = NULL;
    *line = 0;
    if (dwarf_attr(die, DW_AT_call_line, &a) && dwarf_formudata(&a, &w) == 0)
        *line = (uint32_t)w;
    if (dwarf_attr(die, DW_AT_call_file, &a) && dwarf_formudata(&a, &w) == 0) {
        Dwarf_Die cu;
        Dwarf_Files *files;
        size_t nfiles;
        if (dwarf_diecu(die, &cu, NULL, NULL) &&
            dwarf_getsrcfiles(&cu, &files, &nfiles) == 0 && w < nfiles)
            *file = intern(s, dwarf_filesrc(files, w, NULL, NULL));
    }
}

/* The subprogram and inlined-subroutine DIEs containing pc, outermost
 * first, appended to chain. dwarf_getscopes() gives up on some LTO units
 * ("no address value"), so walk the unit ourselves: descend into the one
 * child scope that holds pc; namespaces hold no addresses but may hold
 * functions (class members are defined outside their class). Returns 1
 * once pc's innermost scope was reached. */
#define SCOPE_MAX 64
static int pc_scopes(Dwarf_Die *parent, Dwarf_Addr pc, Dwarf_Die *chain, int *n, int depth)
{
    Dwarf_Die die;
    if (depth > SCOPE_MAX || dwarf_child(parent, &die) != 0)
        return 0;
    do {
        switch (dwarf_tag(&die)) {
        case DW_TAG_subprogram:
        case DW_TAG_inlined_subroutine:
            if (dwarf_haspc(&die, pc) > 0) {
                if (*n < SCOPE_MAX)
                    chain[(*n)++] = die;
                pc_scopes(&die, pc, chain, n, depth + 1);
                return 1;
            }
            break;
        case DW_TAG_lexical_block:
        case DW_TAG_try_block:
        case DW_TAG_catch_block:
            if (dwarf_haspc(&die, pc) > 0) {
                pc_scopes(&die, pc, chain, n, depth + 1);
                return 1;
            }
            break;
        case DW_TAG_namespace:
            if (pc_scopes(&die, pc, chain, n, depth + 1))
                return 1;
            break;
        default:
            break;
        }
    } while (dwarf_siblingof(&die, &die) == 0);
    return 0;
}

/* Fills frames for an address inside an opened module. */
static int describe(cs_symbolizer *s, sym_mod *m, uint64_t ip, cs_frame_info *out, int max)
{
    /* a return address points after the call: look up the call itself,
     * where the shared module was reported */
    Dwarf_Addr pc = (ip ? ip - 1 : ip) - m->delta;
    GElf_Off symoff;
    GElf_Sym sym;
    const char *symname = dwfl_module_addrinfo(m->mod, pc, &symoff, &sym, NULL, NULL, NULL);
    char unversioned[512];
    const char *at = symname ? strchr(symname, '@') : NULL;
    if (at && (size_t)(at - symname) < sizeof unversioned) {
        /* "__libc_start_main@@GLIBC_2.34": the version is linker detail */
        memcpy(unversioned, symname, (size_t)(at - symname));
        unversioned[at - symname] = 0;
        symname = unversioned;
    }
    const char *func = pretty_name(s, symname);

    const char *file = NULL;
    int line = 0;
    Dwfl_Line *l = dwfl_module_getsrc(m->mod, pc);
    if (l)
        file = intern(s, dwfl_lineinfo(l, NULL, &line, NULL, NULL, NULL));

    cs_frame_info base = {
        .python = 0, .module = m->path, .address = ip,
        .offset = ip - m->rec->base, .build_id = m->build_id,
    };
    int n = 0, done = 0;
    Dwarf_Addr bias;
    Dwarf_Die *cu = dwfl_module_addrdie(m->mod, pc, &bias);
    Dwarf_Die chain[SCOPE_MAX];
    int ns = 0;
    if (cu)
        pc_scopes(cu, pc - bias, chain, &ns, 0);
    const char *cur_file = file;
    uint32_t cur_line = line > 0 ? (uint32_t)line : 0;
    /* innermost first: each inlined call's site is its caller's line */
    for (int i = ns - 1; i >= 0 && n < max && !done; i--) {
        int tag = dwarf_tag(&chain[i]);
        cs_frame_info f = base;
        f.file = cur_file;
        f.line = cur_line;
        if (tag == DW_TAG_inlined_subroutine) {
            f.function = die_name(s, &chain[i]);
            f.inlined = 1;
            call_site(s, &chain[i], &cur_file, &cur_line);
        } else {
            /* the symbol table's name agrees with what a linker sees */
            f.function = func ? func : die_name(s, &chain[i]);
            done = 1;
        }
        out[n++] = f;
    }
    if (!done) {
        cs_frame_info f = base;
        f.function = func;
        f.file = cur_file;
        f.line = cur_line;
        if (n == max)
            n--;                    /* the real function always comes last */
        out[n++] = f;
    }
    return n;
}

static int lookup(cs_symbolizer *s, uint64_t ip, cs_frame_info *out, int max)
{
    sym_mod *m = find_module(s, ip);
    if (m && open_module(m))
        return describe(s, m, ip, out, max);
    cs_frame_info f = { .python = 0, .address = ip };
    if (m) {
        f.module = m->path;
        f.offset = ip - m->rec->base;
        f.build_id = m->build_id;
    }
    out[0] = f;
    return 1;
}

int cs_sym_native(cs_symbolizer *s, uint64_t ip, cs_frame_info *out, int max)
{
    if (max <= 0)
        return 0;
    if ((s->cache_n + 1) * 2 > s->cache_cap) {
        size_t ncap = s->cache_cap ? s->cache_cap * 2 : 1024;
        cache_ent *n = cs_xrealloc(NULL, ncap * sizeof *n);
        memset(n, 0, ncap * sizeof *n);
        for (size_t i = 0; i < s->cache_cap; i++) {
            if (!s->cache[i].used)
                continue;
            size_t j = cs_hash64(s->cache[i].ip) & (ncap - 1);
            while (n[j].used)
                j = (j + 1) & (ncap - 1);
            n[j] = s->cache[i];
        }
        free(s->cache);
        s->cache = n;
        s->cache_cap = ncap;
    }
    size_t j = cs_hash64(ip) & (s->cache_cap - 1);
    while (s->cache[j].used && s->cache[j].ip != ip)
        j = (j + 1) & (s->cache_cap - 1);
    cache_ent *e = &s->cache[j];
    if (!e->used) {
        cs_frame_info tmp[SYM_MAX_FRAMES];
        int n = lookup(s, ip, tmp, SYM_MAX_FRAMES);
        if (s->pool_n + (size_t)n > s->pool_cap) {
            s->pool_cap = s->pool_cap ? s->pool_cap * 2 : 1024;
            while (s->pool_n + (size_t)n > s->pool_cap)
                s->pool_cap *= 2;
            s->pool = cs_xrealloc(s->pool, s->pool_cap * sizeof *s->pool);
        }
        memcpy(s->pool + s->pool_n, tmp, (size_t)n * sizeof *tmp);
        e->ip = ip;
        e->used = 1;
        e->n = (uint32_t)n;
        e->first = s->pool_n;
        s->pool_n += (size_t)n;
        s->cache_n++;
    }
    int n = (int)e->n;
    if (n > max) {
        /* keep the real function (last) when the caller has little room */
        memcpy(out, s->pool + e->first + (n - max), (size_t)max * sizeof *out);
        return max;
    }
    memcpy(out, s->pool + e->first, (size_t)n * sizeof *out);
    return n;
}
