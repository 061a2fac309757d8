/* Module records (see modules.h). */
#include "modules.h"

#include <link.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "tracefile.h"
#include "alloc.h"

typedef struct seen {
    uintptr_t base;
    const void *phdr;
    uint64_t name; /* a hash of its path: another library may be loaded at
                    * the same address after a dlclose, same layout and all */
    uint32_t gen;
} seen;

static seen *tab;
static unsigned n, cap;
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static char exe[512];

static seen *lookup(uintptr_t base, const void *phdr)
{
    for (unsigned i = 0; i < n; i++)
        if (tab[i].base == base && tab[i].phdr == phdr)
            return &tab[i];
    return NULL;
}

static uint64_t name_hash(const char *s)
{
    uint64_t h = 1469598103934665603ull; /* FNV-1a */
    for (; s && *s; s++)
        h = (h ^ (unsigned char)*s) * 1099511628211ull;
    return h;
}

/* info's MODULE record; 0 when the trace took none */
static int write_module(const struct dl_phdr_info *info)
{
    uintptr_t lo = UINTPTR_MAX, hi = 0;
    const unsigned char *bid = NULL;
    uint32_t bidlen = 0;
    for (int i = 0; i < info->dlpi_phnum; i++) {
        const ElfW(Phdr) *ph = &info->dlpi_phdr[i];
        if (ph->p_type == PT_LOAD) {
            uintptr_t a = info->dlpi_addr + ph->p_vaddr;
            if (a < lo)
                lo = a;
            if (a + ph->p_memsz > hi)
                hi = a + ph->p_memsz;
        } else if (ph->p_type == PT_NOTE && !bid) {
            const char *p = (const char *)(info->dlpi_addr + ph->p_vaddr), *end = p + ph->p_memsz;
            while (p + sizeof(ElfW(Nhdr)) <= end) {
                const ElfW(Nhdr) *nh = (const ElfW(Nhdr) *)p;
                const char *name = p + sizeof *nh;
                const char *desc = name + ((nh->n_namesz + 3) & ~3u);
                if (nh->n_type == NT_GNU_BUILD_ID && nh->n_namesz == 4 && !memcmp(name, "GNU", 4) &&
                    desc + nh->n_descsz <= end) {
                    bid = (const unsigned char *)desc;
                    bidlen = nh->n_descsz;
                    break;
                }
                p = desc + ((nh->n_descsz + 3) & ~3u);
            }
        }
    }
    if (hi == 0)
        return 0;
    const char *path = info->dlpi_name && *info->dlpi_name ? info->dlpi_name : NULL;
    if (!path) {
        /* the main program has no name here */
        if (!exe[0]) {
            ssize_t l = readlink("/proc/self/exe", exe, sizeof exe - 1);
            exe[l > 0 ? l : 0] = 0;
        }
        path = exe;
    }
    size_t plen = strlen(path);
    cs_rec_module m = {.base = info->dlpi_addr, .lo = lo, .hi = hi, .build_id_len = bidlen,
                       .path_len = (uint32_t)plen};
    cs_rec *h;
    char *p = cs_trace_begin(CS_REC_MODULE, sizeof m + bidlen + plen + 1, &h);
    if (!p)
        return 0;
    memcpy(p, &m, sizeof m);
    if (bidlen) /* a module without a build id (some wheels' libraries) has bid NULL */
        memcpy(p + sizeof m, bid, bidlen);
    memcpy(p + sizeof m + bidlen, path, plen + 1);
    cs_trace_commit(h, CS_REC_MODULE);
    return 1;
}

static int cb(struct dl_phdr_info *info, size_t size, void *data)
{
    (void)size;
    (void)data;
    uint32_t g = cs_trace_gen();
    seen *s = lookup(info->dlpi_addr, info->dlpi_phdr);
    uint64_t nh = name_hash(info->dlpi_name);
    if ((s && s->gen == g && s->name == nh) || !write_module(info))
        return 0;
    if (!s && n == cap) {
        unsigned nc = cap ? cap * 2 : 256;
        seen *t = cs_realloc(tab, nc * sizeof *t);
        if (!t)
            return 0;
        tab = t;
        cap = nc;
    }
    if (!s)
        s = &tab[n++];
    s->base = info->dlpi_addr;
    s->phdr = info->dlpi_phdr;
    s->name = nh;
    s->gen = g;
    return 0;
}

void cs_modules_note(void)
{
    pthread_mutex_lock(&mu);
    dl_iterate_phdr(cb, NULL);
    pthread_mutex_unlock(&mu);
}

static int cb_all(struct dl_phdr_info *info, size_t size, void *data)
{
    (void)size;
    (void)data;
    write_module(info);
    return 0;
}

void cs_modules_note_all(void)
{
    /* glibc's lock around the list is recursive: a crash inside a walk of
     * this very thread's does not deadlock here */
    dl_iterate_phdr(cb_all, NULL);
}
