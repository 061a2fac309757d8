/* Function names from a module's .symtab (elfsyms.h). The file is
 * untrusted input like any other: every offset and size is checked before
 * it is used, and a file that does not check out is simply not used. */
#include "elfsyms.h"

#include <elf.h>
#include <fcntl.h>
#include <link.h>
#include <pthread.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#define MAX_MODULES 1024      /* past that, dladdr's names */
#define MAX_BUILD_ID 64
#define POOL_CHUNK 65536
/* symbols looked at below an address for one that holds it (a sized
 * symbol inside another, such as a local label, may sit in between) */
#define MAX_BACK 16

typedef struct fsym {
    uint64_t lo;          /* st_value: relative to the load bias */
    uint32_t size;
    uint32_t name;        /* into the module's names */
    uint32_t rank;        /* global before weak before local, at one address */
} fsym;

typedef struct module {
    uintptr_t bias;
    uint64_t path_hash;
    int state;            /* 1: symbols below; -1: nothing usable */
    const char *build_id; /* the loaded object's, hex (in the pool), or NULL */
    fsym *syms;
    uint32_t nsyms;
    char *names;
    size_t syms_bytes, names_bytes; /* the two anonymous mappings */
} module;

static module mods[MAX_MODULES];
static unsigned nmods;
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;

void cs_elfsyms_fork_child(void) { pthread_mutex_init(&mu, NULL); }

static uint64_t path_hash(const char *s)
{
    uint64_t h = 1469598103934665603ull; /* FNV-1a */
    for (; *s; s++)
        h = (h ^ (unsigned char)*s) * 1099511628211ull;
    return h;
}

/* anonymous memory: malloc is hooked, and this runs inside reports */
static void *anon(size_t n)
{
    void *p = mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    return p == MAP_FAILED ? NULL : p;
}

/* small strings kept for the process's life (build ids); under mu */
static char *pool;
static size_t pool_left;

static const char *keep(const char *s, size_t n)
{
    if (n + 1 > pool_left) {
        char *p = anon(POOL_CHUNK);
        if (!p)
            return NULL;
        pool = p;
        pool_left = POOL_CHUNK;
    }
    char *d = pool;
    memcpy(d, s, n);
    d[n] = 0;
    pool += n + 1;
    pool_left -= n + 1;
    return d;
}

static void drop(module *m)
{
    if (m->syms)
        munmap(m->syms, m->syms_bytes);
    if (m->names)
        munmap(m->names, m->names_bytes);
    m->syms = NULL;
    m->names = NULL;
    m->state = -1;
}

/* ---- build ids: the loaded object's, and the file's ---- */

/* The GNU build id among the notes in p[0, n), or 0. */
static size_t note_build_id(const unsigned char *p, size_t n, const unsigned char **id)
{
    size_t off = 0;
    while (n - off >= sizeof(ElfW(Nhdr))) {
        ElfW(Nhdr) nh;
        memcpy(&nh, p + off, sizeof nh);
        size_t name = off + sizeof nh, namesz = ((size_t)nh.n_namesz + 3) & ~(size_t)3;
        if (namesz > n - name)
            return 0;
        size_t desc = name + namesz, descsz = ((size_t)nh.n_descsz + 3) & ~(size_t)3;
        if (nh.n_descsz > n - desc)
            return 0;
        if (nh.n_type == NT_GNU_BUILD_ID && nh.n_namesz == 4 && !memcmp(p + name, "GNU", 4)) {
            *id = p + desc;
            return nh.n_descsz;
        }
        if (descsz > n - desc)
            return 0;
        off = desc + descsz;
    }
    return 0;
}

typedef struct loaded {
    uintptr_t bias;
    const char *path;
    unsigned char id[MAX_BUILD_ID];
    size_t len;
} loaded;

static int find_loaded(struct dl_phdr_info *info, size_t size, void *data)
{
    (void)size;
    loaded *w = data;
    if (info->dlpi_addr != w->bias || strcmp(info->dlpi_name ? info->dlpi_name : "", w->path))
        return 0;
    for (int i = 0; i < info->dlpi_phnum; i++) {
        const ElfW(Phdr) *ph = &info->dlpi_phdr[i];
        const unsigned char *id;
        size_t n;
        if (ph->p_type == PT_NOTE &&
            (n = note_build_id((const unsigned char *)(info->dlpi_addr + ph->p_vaddr), ph->p_memsz,
                               &id)) &&
            n <= MAX_BUILD_ID) {
            memcpy(w->id, id, n);
            w->len = n;
            break;
        }
    }
    return 1;
}

/* ---- reading the file ---- */

/* a section's bytes, if they lie in the file */
static const unsigned char *section(const unsigned char *f, size_t size, const ElfW(Shdr) *s)
{
    if (s->sh_type == SHT_NOBITS || s->sh_offset > size || s->sh_size > size - s->sh_offset)
        return NULL;
    return f + s->sh_offset;
}

static uint32_t rank_of(unsigned bind)
{
    return bind == STB_GLOBAL ? 0 : bind == STB_WEAK ? 1 : 2;
}

static int before(const fsym *a, const fsym *b)
{
    return a->lo < b->lo || (a->lo == b->lo && a->rank < b->rank);
}

/* heapsort: no allocation, bounded stack */
static void sift(fsym *v, size_t i, size_t n)
{
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= n)
            return;
        if (c + 1 < n && before(&v[c], &v[c + 1]))
            c++;
        if (!before(&v[i], &v[c]))
            return;
        fsym t = v[i];
        v[i] = v[c];
        v[c] = t;
        i = c;
    }
}

static void sort_syms(fsym *v, size_t n)
{
    for (size_t i = n / 2; i-- > 0;)
        sift(v, i, n);
    for (size_t k = n; k-- > 1;) {
        fsym t = v[0];
        v[0] = v[k];
        v[k] = t;
        sift(v, 0, k);
    }
}

static int is_function(const ElfW(Sym) *s)
{
    unsigned type = ELF64_ST_TYPE(s->st_info);
    return (type == STT_FUNC || type == STT_GNU_IFUNC) && s->st_size && s->st_name &&
           s->st_shndx != SHN_UNDEF && s->st_shndx < SHN_LORESERVE;
}

static void index_file(module *m, const unsigned char *f, size_t size, const loaded *w)
{
    ElfW(Ehdr) eh;
    memcpy(&eh, f, sizeof eh);
    if (memcmp(eh.e_ident, ELFMAG, SELFMAG) || eh.e_ident[EI_CLASS] != ELFCLASS64 ||
        eh.e_shentsize != sizeof(ElfW(Shdr)) || !eh.e_shoff || eh.e_shoff % 8 ||
        eh.e_shoff > size || eh.e_shnum > (size - eh.e_shoff) / sizeof(ElfW(Shdr)))
        return;
    const ElfW(Shdr) *sh = (const ElfW(Shdr) *)(f + eh.e_shoff);
    /* a file rebuilt since it was loaded would name the wrong functions */
    if (w->len) {
        int same = 0;
        for (unsigned i = 0; i < eh.e_shnum && !same; i++) {
            const unsigned char *p = sh[i].sh_type == SHT_NOTE ? section(f, size, &sh[i]) : NULL;
            const unsigned char *id;
            size_t n = p ? note_build_id(p, sh[i].sh_size, &id) : 0;
            if (n)
                same = n == w->len && !memcmp(id, w->id, n) ? 1 : -1;
        }
        if (same != 1)
            return;
    }
    const ElfW(Shdr) *st = NULL;
    for (unsigned i = 0; i < eh.e_shnum && !st; i++)
        if (sh[i].sh_type == SHT_SYMTAB)
            st = &sh[i];
    /* stripped: dladdr's .dynsym names are all there is */
    if (!st || st->sh_entsize != sizeof(ElfW(Sym)) || st->sh_offset % 8 ||
        st->sh_link >= eh.e_shnum || sh[st->sh_link].sh_type != SHT_STRTAB)
        return;
    const ElfW(Sym) *sym = (const ElfW(Sym) *)section(f, size, st);
    const char *str = (const char *)section(f, size, &sh[st->sh_link]);
    size_t nsym = st->sh_size / sizeof *sym, strsz = sh[st->sh_link].sh_size;
    if (!sym || !str || !strsz || str[strsz - 1])
        return;
    size_t n = 0;
    for (size_t i = 0; i < nsym; i++)
        n += is_function(&sym[i]) && sym[i].st_name < strsz;
    if (!n || n > UINT32_MAX)
        return;
    m->syms_bytes = n * sizeof(fsym);
    if (!(m->syms = anon(m->syms_bytes)))
        return;
    size_t k = 0;
    for (size_t i = 0; i < nsym; i++)
        if (is_function(&sym[i]) && sym[i].st_name < strsz)
            m->syms[k++] = (fsym){
                .lo = sym[i].st_value,
                .size = sym[i].st_size > UINT32_MAX ? UINT32_MAX : (uint32_t)sym[i].st_size,
                .name = sym[i].st_name,
                .rank = rank_of(ELF64_ST_BIND(sym[i].st_info)),
            };
    sort_syms(m->syms, n);
    /* one name per address (aliases: the global one), then the names
     * copied out of the file, which is unmapped after this */
    size_t kept = 0, bytes = 0;
    for (size_t i = 0; i < n; i++) {
        if (kept && m->syms[kept - 1].lo == m->syms[i].lo)
            continue;
        m->syms[kept++] = m->syms[i];
        bytes += strlen(str + m->syms[i].name) + 1;
    }
    if (bytes > UINT32_MAX || !(m->names = anon(m->names_bytes = bytes))) {
        drop(m);
        return;
    }
    size_t at = 0;
    for (size_t i = 0; i < kept; i++) {
        size_t l = strlen(str + m->syms[i].name) + 1;
        memcpy(m->names + at, str + m->syms[i].name, l);
        m->syms[i].name = (uint32_t)at;
        at += l;
    }
    m->nsyms = (uint32_t)kept;
    mprotect(m->syms, m->syms_bytes, PROT_READ);
    mprotect(m->names, m->names_bytes, PROT_READ);
    m->state = 1;
}

/* a module being read, outside the lock, with its build id until kept */
typedef struct loading {
    module m;
    char hex_id[2 * MAX_BUILD_ID];
    size_t hex_len;
} loading;

static void load(loading *l, const char *path)
{
    module *m = &l->m;
    m->state = -1;
    loaded w = {.bias = m->bias, .path = path};
    dl_iterate_phdr(find_loaded, &w);
    static const char hex[] = "0123456789abcdef";
    for (size_t i = 0; i < w.len; i++) {
        l->hex_id[2 * i] = hex[w.id[i] >> 4];
        l->hex_id[2 * i + 1] = hex[w.id[i] & 15];
    }
    l->hex_len = 2 * w.len;
    int fd = open(*path ? path : "/proc/self/exe", O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0)
        return;
    struct stat sb;
    void *f = MAP_FAILED;
    if (fstat(fd, &sb) == 0 && S_ISREG(sb.st_mode) && sb.st_size >= (off_t)sizeof(ElfW(Ehdr)))
        f = mmap(NULL, (size_t)sb.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
    close(fd);
    if (f == MAP_FAILED)
        return;
    index_file(m, f, (size_t)sb.st_size, &w);
    munmap(f, (size_t)sb.st_size);
}

static const char *find(const module *m, uint64_t off)
{
    if (m->state <= 0)
        return NULL;
    uint32_t a = 0, b = m->nsyms; /* a: the first symbol above off */
    while (a < b) {
        uint32_t mid = a + (b - a) / 2;
        if (m->syms[mid].lo <= off)
            a = mid + 1;
        else
            b = mid;
    }
    for (uint32_t i = a, k = 0; i-- > 0 && k < MAX_BACK; k++)
        if (off - m->syms[i].lo < m->syms[i].size)
            return m->names + m->syms[i].name;
    return NULL;
}

static module *lookup(uintptr_t bias, uint64_t h)
{
    for (unsigned i = 0; i < nmods; i++)
        if (mods[i].bias == bias && mods[i].path_hash == h)
            return &mods[i];
    return NULL;
}


const char *cs_elfsyms_name(const char *path, uintptr_t bias, uint64_t off, const char **build_id)
{
    *build_id = NULL;
    if (!path)
        return NULL;
    uint64_t h = path_hash(path);
    pthread_mutex_lock(&mu);
    module *m = lookup(bias, h);
    const char *name = m ? find(m, off) : NULL;
    *build_id = m ? m->build_id : NULL;
    pthread_mutex_unlock(&mu);
    if (m)
        return name;
    /* read outside the lock: dl_iterate_phdr takes the loader's lock,
     * which a thread in dlopen holds while it may wait for this one */
    loading fresh = {.m = {.bias = bias, .path_hash = h}};
    load(&fresh, path);
    pthread_mutex_lock(&mu);
    if (!(m = lookup(bias, h)) && nmods < MAX_MODULES) {
        m = &mods[nmods++];
        *m = fresh.m;
        m->build_id = fresh.hex_len ? keep(fresh.hex_id, fresh.hex_len) : NULL;
    } else {
        /* another thread read it first, or the table is full (then no
         * name: one is handed out only from a table entry, kept for good) */
        drop(&fresh.m);
    }
    name = m ? find(m, off) : NULL;
    *build_id = m ? m->build_id : NULL;
    pthread_mutex_unlock(&mu);
    return name;
}
