/* GOT/PLT patching over dl_iterate_phdr (see got.h). */
#include "got.h"

#include <dlfcn.h>
#include <elf.h>
#include <link.h>
#include <stddef.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "alloc.h"

typedef struct slot {
    uintptr_t addr;
    uintptr_t orig;
    uintptr_t repl; /* what was written: restored only while it is still there */
    int ro;       /* inside PT_GNU_RELRO: read-only once relocated */
} slot;

typedef struct patched {
    uintptr_t base;
    const void *phdr;
    char name[128];
    int seen;     /* found in the current walk */
    slot *slots;
    unsigned nslots;
    const uint64_t *letters; /* first letters of the hooks that apply to it */
} patched;

static const cs_hook *hooks;
static int nhooks;
static uintptr_t self_base;
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static patched *objs;
static unsigned nobjs, capobjs;
static unsigned long long last_adds = ~0ull, last_subs = ~0ull;
static unsigned total_slots;
static size_t pagesz;

/* the first letters of the general hooks' names, and of all hooks' (for
 * the few objects an only_in hook applies to): most relocations of a
 * large library are dismissed by one bit test */
static uint64_t letters_general[4], letters_all[4];

/* each hook's symbol as the global scope resolves it (dlsym), looked up the
 * first time a data relocation names it: 0 not yet, 1 none */
static uintptr_t defined_at[64];

void cs_got_init(const cs_hook *h, int n, const void *self)
{
    hooks = h;
    nhooks = n;
    for (int i = 0; i < n; i++) {
        unsigned char c0 = (unsigned char)h[i].name[0];
        letters_all[c0 >> 6] |= 1ull << (c0 & 63);
        if (!h[i].only_in)
            letters_general[c0 >> 6] |= 1ull << (c0 & 63);
    }
    Dl_info di;
    if (dladdr(self, &di))
        self_base = (uintptr_t)di.dli_fbase;
    pagesz = (size_t)sysconf(_SC_PAGESIZE);
}

static patched *lookup(uintptr_t base, const void *phdr, const char *name)
{
    for (unsigned i = 0; i < nobjs; i++)
        if (objs[i].base == base && objs[i].phdr == phdr &&
            strncmp(objs[i].name, name, sizeof objs[i].name - 1) == 0)
            return &objs[i];
    return NULL;
}

static int skip_object(const struct dl_phdr_info *info)
{
    const char *n = info->dlpi_name ? info->dlpi_name : "";
    if (strstr(n, "/ld-linux") || strstr(n, "/ld-musl") || strstr(n, "linux-vdso") ||
        strstr(n, "linux-gate"))
        return 1;
    /* our own slots must keep pointing at the real functions */
    for (int i = 0; i < info->dlpi_phnum; i++) {
        const ElfW(Phdr) *ph = &info->dlpi_phdr[i];
        if (ph->p_type == PT_LOAD && self_base >= info->dlpi_addr + ph->p_vaddr &&
            self_base < info->dlpi_addr + ph->p_vaddr + ph->p_memsz && info->dlpi_addr == self_base)
            return 1;
    }
    return info->dlpi_addr == self_base && self_base != 0;
}

/* The hook for symbol s in object `obj`: one limited to that object
 * (only_in) wins over the name's general one. */
static const cs_hook *match(const char *s, const char *obj, const uint64_t *letters)
{
    /* the first letters of the hooked names: a cheap first cut */
    unsigned char c0 = (unsigned char)s[0];
    if (!(letters[c0 >> 6] & (1ull << (c0 & 63))))
        return NULL;
    const cs_hook *any = NULL;
    for (int i = 0; i < nhooks; i++)
        if (strcmp(s, hooks[i].name) == 0) {
            if (!hooks[i].only_in) {
                if (!any)
                    any = &hooks[i];
            } else if (strstr(obj, hooks[i].only_in)) {
                return &hooks[i];
            }
        }
    return any;
}

/* A data relocation (R_X86_64_64) fills a variable or a table entry, not a
 * call slot: `void (*mpd_free)(void *) = free;` in libmpdec, expat's default
 * {malloc, realloc, free}. The program may write such a variable after it
 * was relocated: CPython's _decimal sets mpd_free = PyMem_Free at import.
 * When capsan starts late (import capsan, the pytest plugin), rewriting that
 * variable with the hook of the name the relocation still carries would pair
 * PyMem_Malloc's blocks with free(). So a data slot is taken only while it
 * still holds the symbol's own address. Every hook forwards to the function
 * it stands in for, so a pointer taken before the start (left alone: its
 * calls are not seen) and the hooked one after it free with the same
 * deallocator either way; the only unsafe write is over a value the program
 * chose, and that is what this refuses. */
static int data_slot_untouched(const cs_hook *h, uintptr_t value)
{
    int i = (int)(h - hooks);
    if (i < 0 || i >= (int)(sizeof defined_at / sizeof defined_at[0]))
        return 0;
    if (!defined_at[i]) {
        void *d = dlsym(RTLD_DEFAULT, h->name);
        defined_at[i] = d ? (uintptr_t)d : 1;
    }
    if (value == defined_at[i])
        return 1;
    /* a symbol version or a scope other than the global one (RTLD_LOCAL,
     * DEEPBIND) may bind the same name elsewhere: the address's own name */
    Dl_info di;
    return value && dladdr((void *)value, &di) && di.dli_sname &&
           (uintptr_t)di.dli_saddr == value && strcmp(di.dli_sname, h->name) == 0;
}

static void write_slot(patched *p, uintptr_t addr, uintptr_t val, uintptr_t relro_lo,
                       uintptr_t relro_hi)
{
    int ro = addr >= relro_lo && addr < relro_hi;
    uintptr_t page = addr & ~(uintptr_t)(pagesz - 1);
    if (ro && mprotect((void *)page, pagesz, PROT_READ | PROT_WRITE) != 0)
        return;
    slot *ns = cs_realloc(p->slots, (p->nslots + 1) * sizeof *ns);
    if (ns) {
        p->slots = ns;
        ns[p->nslots].addr = addr;
        ns[p->nslots].orig = *(uintptr_t *)addr;
        ns[p->nslots].repl = val;
        ns[p->nslots].ro = ro;
        p->nslots++;
        __atomic_store_n((uintptr_t *)addr, val, __ATOMIC_RELEASE);
        total_slots++;
    }
    if (ro)
        mprotect((void *)page, pagesz, PROT_READ);
}

static void patch_relocs(patched *p, uintptr_t base, const ElfW(Sym) *symtab, const char *strtab,
                         size_t strsz, const void *rel, size_t relsz, int is_rela,
                         uintptr_t relro_lo, uintptr_t relro_hi)
{
    size_t ent = is_rela ? sizeof(ElfW(Rela)) : sizeof(ElfW(Rel));
    for (size_t off = 0; off + ent <= relsz; off += ent) {
        uintptr_t r_offset;
        size_t r_info;
        intptr_t addend = 0;
        if (is_rela) {
            const ElfW(Rela) *r = (const ElfW(Rela) *)((const char *)rel + off);
            r_offset = r->r_offset;
            r_info = r->r_info;
            addend = (intptr_t)r->r_addend;
        } else {
            const ElfW(Rel) *r = (const ElfW(Rel) *)((const char *)rel + off);
            r_offset = r->r_offset;
            r_info = r->r_info;
        }
        size_t type = ELF64_R_TYPE(r_info), symi = ELF64_R_SYM(r_info);
        if (!symi)
            continue; /* RELATIVE and friends: most of a large table */
        if (type != R_X86_64_JUMP_SLOT && type != R_X86_64_GLOB_DAT && type != R_X86_64_64)
            continue;
        size_t name = symtab[symi].st_name;
        if (name >= strsz)
            continue;
        const cs_hook *h = match(strtab + name, p->name, p->letters);
        if (!h)
            continue;
        uintptr_t addr = base + r_offset;
        uintptr_t cur = *(uintptr_t *)addr;
        if (cur == (uintptr_t)h->replacement)
            continue;
        /* a call slot (JUMP_SLOT, GLOB_DAT) is the linker's alone; a data
         * slot is also the program's (data_slot_untouched) */
        if (type == R_X86_64_64 && (addend || !data_slot_untouched(h, cur)))
            continue;
        write_slot(p, addr, (uintptr_t)h->replacement, relro_lo, relro_hi);
    }
}

static uintptr_t reloc_ptr(uintptr_t v, uintptr_t base)
{
    /* glibc stores relocated d_ptr values; some loaders leave them raw */
    return v < base ? v + base : v;
}

static void patch_object(patched *p, const struct dl_phdr_info *info)
{
    p->letters = letters_general;
    for (int i = 0; i < nhooks; i++)
        if (hooks[i].only_in && strstr(p->name, hooks[i].only_in))
            p->letters = letters_all;
    const ElfW(Dyn) *dyn = NULL;
    uintptr_t base = info->dlpi_addr, relro_lo = 0, relro_hi = 0;
    for (int i = 0; i < info->dlpi_phnum; i++) {
        const ElfW(Phdr) *ph = &info->dlpi_phdr[i];
        if (ph->p_type == PT_DYNAMIC)
            dyn = (const ElfW(Dyn) *)(base + ph->p_vaddr);
        else if (ph->p_type == PT_GNU_RELRO) {
            relro_lo = (base + ph->p_vaddr) & ~(uintptr_t)(pagesz - 1);
            relro_hi = (base + ph->p_vaddr + ph->p_memsz + pagesz - 1) & ~(uintptr_t)(pagesz - 1);
        }
    }
    if (!dyn)
        return;
    const ElfW(Sym) *symtab = NULL;
    const char *strtab = NULL;
    size_t strsz = 0, jmprelsz = 0, relasz = 0, relsz = 0;
    const void *jmprel = NULL, *rela = NULL, *rel = NULL;
    int pltrel = DT_RELA;
    for (const ElfW(Dyn) *d = dyn; d->d_tag != DT_NULL; d++) {
        switch (d->d_tag) {
        case DT_SYMTAB: symtab = (const void *)reloc_ptr(d->d_un.d_ptr, base); break;
        case DT_STRTAB: strtab = (const void *)reloc_ptr(d->d_un.d_ptr, base); break;
        case DT_STRSZ: strsz = d->d_un.d_val; break;
        case DT_JMPREL: jmprel = (const void *)reloc_ptr(d->d_un.d_ptr, base); break;
        case DT_PLTRELSZ: jmprelsz = d->d_un.d_val; break;
        case DT_PLTREL: pltrel = (int)d->d_un.d_val; break;
        case DT_RELA: rela = (const void *)reloc_ptr(d->d_un.d_ptr, base); break;
        case DT_RELASZ: relasz = d->d_un.d_val; break;
        case DT_REL: rel = (const void *)reloc_ptr(d->d_un.d_ptr, base); break;
        case DT_RELSZ: relsz = d->d_un.d_val; break;
        }
    }
    if (!symtab || !strtab)
        return;
    if (jmprel)
        patch_relocs(p, base, symtab, strtab, strsz, jmprel, jmprelsz, pltrel == DT_RELA,
                     relro_lo, relro_hi);
    if (rela)
        patch_relocs(p, base, symtab, strtab, strsz, rela, relasz, 1, relro_lo, relro_hi);
    if (rel)
        patch_relocs(p, base, symtab, strtab, strsz, rel, relsz, 0, relro_lo, relro_hi);
}

struct scan_ctx {
    int patched;
    int forget;   /* only mark what is still loaded */
};

static int scan_cb(struct dl_phdr_info *info, size_t size, void *data)
{
    struct scan_ctx *c = data;
    (void)size;
    const char *name = info->dlpi_name ? info->dlpi_name : "";
    patched *p = lookup(info->dlpi_addr, info->dlpi_phdr, name);
    if (p) {
        p->seen = 1;
        return 0;
    }
    if (c->forget || skip_object(info))
        return 0;
    if (nobjs == capobjs) {
        unsigned ncap = capobjs ? capobjs * 2 : 256;
        patched *n = cs_realloc(objs, ncap * sizeof *n);
        if (!n)
            return 0;
        objs = n;
        capobjs = ncap;
    }
    p = &objs[nobjs++];
    memset(p, 0, sizeof *p);
    p->base = info->dlpi_addr;
    p->phdr = info->dlpi_phdr;
    strncpy(p->name, name, sizeof p->name - 1);
    p->seen = 1;
    patch_object(p, info);
    c->patched++;
    return 0;
}

static int counters_cb(struct dl_phdr_info *info, size_t size, void *data)
{
    unsigned long long *out = data;
    if (size >= offsetof(struct dl_phdr_info, dlpi_subs) + sizeof info->dlpi_subs) {
        out[0] = info->dlpi_adds;
        out[1] = info->dlpi_subs;
    }
    return 1; /* the counters are the same in every entry: stop at once */
}

int cs_got_scan(void)
{
    struct scan_ctx c = {0, 0};
    unsigned long long cnt[2] = {0, 0};
    pthread_mutex_lock(&mu);
    dl_iterate_phdr(counters_cb, cnt);
    if (cnt[0] != last_adds || cnt[1] != last_subs) {
        dl_iterate_phdr(scan_cb, &c);
        last_adds = cnt[0];
        last_subs = cnt[1];
    }
    pthread_mutex_unlock(&mu);
    return c.patched;
}

void cs_got_forget_unloaded(void)
{
    struct scan_ctx c = {0, 1};
    pthread_mutex_lock(&mu);
    for (unsigned i = 0; i < nobjs; i++)
        objs[i].seen = 0;
    dl_iterate_phdr(scan_cb, &c);
    for (unsigned i = 0; i < nobjs;) {
        if (!objs[i].seen) {
            cs_free(objs[i].slots);
            objs[i] = objs[--nobjs];
        } else {
            i++;
        }
    }
    last_adds = ~0ull; /* rescan for new objects next time */
    pthread_mutex_unlock(&mu);
}

void cs_got_restore(void)
{
    cs_got_forget_unloaded();
    pthread_mutex_lock(&mu);
    for (unsigned i = 0; i < nobjs; i++) {
        patched *p = &objs[i];
        for (unsigned j = 0; j < p->nslots; j++) {
            uintptr_t page = p->slots[j].addr & ~(uintptr_t)(pagesz - 1);
            if (p->slots[j].ro && mprotect((void *)page, pagesz, PROT_READ | PROT_WRITE) != 0)
                continue;
            /* only where the hook still is: a data slot the program wrote
             * since (_decimal imported after the start sets mpd_free) keeps
             * the program's value */
            uintptr_t want = p->slots[j].repl;
            __atomic_compare_exchange_n((uintptr_t *)p->slots[j].addr, &want, p->slots[j].orig, 0,
                                        __ATOMIC_RELEASE, __ATOMIC_RELAXED);
            if (p->slots[j].ro)
                mprotect((void *)page, pagesz, PROT_READ);
        }
        cs_free(p->slots);
    }
    cs_free(objs);
    objs = NULL;
    nobjs = capobjs = 0;
    total_slots = 0;
    last_adds = last_subs = ~0ull;
    pthread_mutex_unlock(&mu);
}

void cs_got_stats(unsigned *o, unsigned *s)
{
    *o = nobjs;
    *s = total_slots;
}
