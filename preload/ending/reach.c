/* Reachability at _exit (reach.h). */
#include "reach.h"
#include "pyapi.h"
#include "pypools.h"
#include "pyversion.h"

#include <dlfcn.h>
#include <fcntl.h>
#include <link.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>

typedef struct range {
    uintptr_t lo, hi;
} range;

struct cs_reach {
    const uint64_t *keys;
    size_t n;
    unsigned char *seen;
    range *own;
    size_t nown, capown;
    int oom;
    unsigned region;    /* CS_WHERE_* of the mapping being scanned */
    unsigned char *buf; /* one pool or page at a time is copied here (BUF bytes) */
    uintptr_t type_type; /* &PyType_Type: a dead object's type is one */
};

#define BUF CS_POOL_SIZE

cs_reach *cs_reach_new(const uint64_t *keys, size_t n)
{
    cs_reach *r = calloc(1, sizeof *r);
    if (!r)
        return NULL;
    r->keys = keys;
    r->n = n;
    if (!(r->seen = calloc(n ? n : 1, 1))) {
        free(r);
        return NULL;
    }
    if (!(r->buf = malloc(BUF))) {
        free(r->seen);
        free(r);
        return NULL;
    }
    cs_reach_own(r, keys, n * sizeof *keys);
    cs_reach_own(r, r->seen, n ? n : 1);
    cs_reach_own(r, r->buf, BUF);
    r->type_type = (uintptr_t)dlsym(RTLD_DEFAULT, "PyType_Type");
    return r;
}

void cs_reach_own(void *reach, const void *p, size_t n)
{
    cs_reach *r = reach;
    if (!p || !n)
        return;
    if (r->nown == r->capown) {
        size_t nc = r->capown ? r->capown * 2 : 256;
        range *o = realloc(r->own, nc * sizeof *o);
        if (!o) {
            r->oom = 1; /* then nothing is judged unreachable (cs_reach_run) */
            return;
        }
        r->own = o;
        r->capown = nc;
    }
    r->own[r->nown++] = (range){(uintptr_t)p, (uintptr_t)p + n};
}

static int cmp_range(const void *a, const void *b)
{
    const range *x = a, *y = b;
    return (x->lo > y->lo) - (x->lo < y->lo);
}

/* the struct itself (a DLManagedTensorVersioned is 80 bytes): its
 * manager_ctx may point at it; a word past it may be a real owner in the
 * next heap chunk (a consumer's 48-byte record of the tensor) */
#define SELF_SPAN 80

/* the words of a copy at [a, b) of the (aligned) memory at `at`; a
 * pymalloc block's (block != 0) are not roots if it is a dead object */
static void scan_words(cs_reach *r, uintptr_t a, uintptr_t b, uintptr_t at, cs_root_cb cb,
                       void *ud, int block)
{
    uint64_t kmin = r->keys[0], kmax = r->keys[r->n - 1];
    for (const uint64_t *p = (const uint64_t *)a; (uintptr_t)(p + 1) <= b; p++, at += 8) {
        uint64_t w = *p;
        if (w < kmin || w > kmax)
            continue; /* most words are not addresses of the keys' kind */
        long i = cs_key_index(r->keys, r->n, w);
        /* an object does not keep itself alive: a DLManagedTensor's
         * manager_ctx often points at the struct that holds it */
        if (i >= 0 && !r->seen[i] && (uint64_t)at - w >= SELF_SPAN) {
            if (block && cs_pool_block_dead((const uint64_t *)a, (b - a) / 8, r->type_type))
                return;
            block = 0; /* asked once */
            r->seen[i] = 1;
            cb(ud, w, (uint64_t)at, 0, r->region);
        }
    }
}

/* the resident pages of [lo, hi) (within one pool-sized chunk), copied
 * into r->buf at their offset from `chunk`; how many were */
static size_t copy_resident(cs_reach *r, uintptr_t chunk, uintptr_t lo, uintptr_t hi,
                            const unsigned char *vec)
{
    enum { PG = 4096 };
    size_t got = 0;
    for (uintptr_t pg = lo & ~(uintptr_t)(PG - 1); pg < hi; pg += PG) {
        uintptr_t a = pg < lo ? lo : pg, b = pg + PG > hi ? hi : pg + PG;
        unsigned char *dst = r->buf + (a - chunk);
        /* copied, not read in place: another thread may unmap it (a
         * thread's stack as it exits) while this one scans */
        struct iovec local = {dst, b - a}, remote = {(void *)a, b - a};
        if ((vec[(pg - chunk) / PG] & 1) &&
            process_vm_readv(getpid(), &local, 1, &remote, 1, 0) == (ssize_t)(b - a))
            got++;
        else
            memset(dst, 0, b - a); /* untouched: zeros */
    }
    return got;
}

/* A pymalloc pool: its carved blocks that are neither free nor dead */
static void scan_pool(cs_reach *r, const cs_pool *pl, uintptr_t chunk, cs_root_cb cb, void *ud)
{
    for (uint32_t off = pl->first, k = 0; off + pl->bs <= pl->end; off += pl->bs, k++)
        if (!cs_pool_block_free(pl, k))
            scan_words(r, (uintptr_t)r->buf + off, (uintptr_t)r->buf + off + pl->bs, chunk + off,
                       cb, ud, 1);
}

/* [a, b), resident pages only: an untouched anonymous page holds zeros,
 * and reading it would map it. In anonymous memory, a pymalloc pool's
 * free blocks and dead objects are not scanned (pypools.h). */
static void scan_resident(cs_reach *r, uintptr_t a, uintptr_t b, cs_root_cb cb, void *ud)
{
    enum { PG = 4096 };
    unsigned char vec[BUF / PG];
    a = (a + 7) & ~(uintptr_t)7; /* whole aligned words: the copy's are the memory's */
    b &= ~(uintptr_t)7;
    for (uintptr_t chunk = a & ~(uintptr_t)(BUF - 1); chunk < b; chunk += BUF) {
        uintptr_t lo = chunk < a ? a : chunk, hi = chunk + BUF > b ? b : chunk + BUF;
        uintptr_t pa = lo & ~(uintptr_t)(PG - 1);
        size_t npg = (hi - pa + PG - 1) / PG;
        if (mincore((void *)pa, npg * PG, vec + (pa - chunk) / PG) != 0)
            memset(vec + (pa - chunk) / PG, 1, npg); /* unknown: scan it */
        if (!copy_resident(r, chunk, lo, hi, vec))
            continue;
        cs_pool pl;
        if (r->region == CS_WHERE_ANON && lo == chunk && hi == chunk + BUF && (vec[0] & 1) &&
            cs_pool_parse(r->buf, chunk, &pl)) {
            scan_pool(r, &pl, chunk, cb, ud);
            continue;
        }
        scan_words(r, (uintptr_t)r->buf + (lo - chunk), (uintptr_t)r->buf + (hi - chunk), lo, cb,
                   ud, 0);
    }
}

/* [a, b) less capsan's own ranges. Regions come in address order (as
 * /proc/self/maps lists them), so one cursor walks the sorted ranges. */
static void scan_region(cs_reach *r, size_t *cur, uintptr_t a, uintptr_t b, cs_root_cb cb,
                        void *ud)
{
    while (a < b) {
        while (*cur < r->nown && r->own[*cur].hi <= a)
            (*cur)++;
        uintptr_t stop = b, resume = b;
        if (*cur < r->nown && r->own[*cur].lo < b) {
            stop = r->own[*cur].lo > a ? r->own[*cur].lo : a;
            resume = r->own[*cur].hi;
        }
        if (stop > a)
            scan_resident(r, a, stop, cb, ud);
        a = resume;
    }
}

static int self_cb(struct dl_phdr_info *info, size_t size, void *arg)
{
    (void)size;
    cs_reach *r = arg;
    Dl_info di;
    if (!dladdr((void *)(uintptr_t)&cs_reach_run, &di) || (uintptr_t)di.dli_fbase != info->dlpi_addr)
        return 0;
    for (int i = 0; i < info->dlpi_phnum; i++) {
        const ElfW(Phdr) *ph = &info->dlpi_phdr[i];
        if (ph->p_type == PT_LOAD)
            cs_reach_own(r, (void *)(info->dlpi_addr + ph->p_vaddr),
                         ph->p_memsz + (ph->p_vaddr & 4095) + 4096);
    }
    return 1;
}

/* The whole /proc/self/maps (no stdio: nothing of capsan's may allocate
 * through the hooked paths more than it must) */
static char *read_maps(void)
{
    int fd = open("/proc/self/maps", O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return NULL;
    size_t cap = 1 << 16, len = 0;
    char *buf = malloc(cap);
    while (buf) {
        if (len + 1 == cap) {
            char *nb = realloc(buf, cap * 2);
            if (!nb) {
                free(buf);
                buf = NULL;
                break;
            }
            buf = nb;
            cap *= 2;
        }
        ssize_t k = read(fd, buf + len, cap - 1 - len);
        if (k <= 0)
            break;
        len += (size_t)k;
    }
    close(fd);
    if (buf)
        buf[len] = 0;
    return buf;
}

/* The calling thread's Python data stack above its top holds the frames
 * of calls that returned (3.11+), each slot a stale word: not scanned. */
static void skip_popped_frames(cs_reach *r)
{
    const cs_pylayout *l = cs_py.layout;
    if (!cs_py.ok || !l || l->ts_ds_top < 0 || !cs_py.ThreadState_UncheckedGet)
        return;
    const char *ts = cs_py.ThreadState_UncheckedGet();
    if (!ts)
        return;
    char *top = *(char *const *)(ts + l->ts_ds_top);
    char *limit = *(char *const *)(ts + l->ts_ds_limit);
    if (top && limit > top && (size_t)(limit - top) < ((size_t)1 << 30))
        cs_reach_own(r, top, (size_t)(limit - top));
}

size_t cs_reach_run(cs_reach *r, cs_root_cb cb, void *ud)
{
    size_t hits = 0;
    skip_popped_frames(r);
    char *maps = read_maps();
    dl_iterate_phdr(self_cb, r);
    if (maps)
        cs_reach_own(r, maps, strlen(maps) + 1);
    if (!maps || r->oom || !r->n) {
        /* cannot tell: everything counts as reachable, nothing as leaked */
        for (size_t i = 0; i < r->n; i++)
            cb(ud, r->keys[i], 0, 0, CS_WHERE_UNKNOWN);
        hits = r->n;
        goto out;
    }
    /* the list of capsan's ranges is capsan's memory too: it holds range
     * starts that may equal a key. Room first, so that listing it does
     * not move it. */
    cs_reach_own(r, r->own, 1);
    r->nown--;
    cs_reach_own(r, r->own, r->capown * sizeof *r->own);
    qsort(r->own, r->nown, sizeof *r->own, cmp_range);
    uintptr_t sp = (uintptr_t)__builtin_frame_address(0);
    size_t cur = 0;
    for (char *line = maps; *line;) {
        char *next = strchr(line, '\n');
        if (next)
            *next = 0;
        unsigned long lo, hi, off;
        char perms[8] = "", path[512] = "";
        unsigned long inode = 0;
        int got = sscanf(line, "%lx-%lx %7s %lx %*s %lu %511[^\n]", &lo, &hi, perms, &off, &inode,
                         path);
        if (got >= 5 && perms[0] == 'r' && perms[1] == 'w' && perms[3] == 'p' &&
            strcmp(path, "[vvar]") && strcmp(path, "[vsyscall]")) {
            /* the calling thread's stack is left out: it is in _exit, so
             * its frames are the interpreter's on the way there, and their
             * unused slots hold stale words of every call made before
             * (Python's own references live in objects on the heap) */
            if (sp >= lo && sp < hi)
                lo = hi;
            /* a private file mapping beyond its file's end faults (SIGBUS) */
            struct stat st;
            if (inode && path[0] == '/' && stat(path, &st) == 0 && S_ISREG(st.st_mode)) {
                unsigned long in_file = (unsigned long)st.st_size > off
                                            ? ((unsigned long)st.st_size - off + 4095) & ~4095ul
                                            : 0;
                if (hi - lo > in_file)
                    hi = lo + in_file;
            }
            r->region = path[0] == '/' ? CS_WHERE_DATA
                        : strcmp(path, "[heap]") == 0 ? CS_WHERE_HEAP
                        : strcmp(path, "[stack]") == 0 ? CS_WHERE_STACK
                        : CS_WHERE_ANON;
            if (hi > lo)
                scan_region(r, &cur, lo, hi, cb, ud);
        }
        if (!next)
            break;
        line = next + 1;
    }
    for (size_t i = 0; i < r->n; i++)
        hits += r->seen[i];
out:
    free(maps);
    free(r->own);
    free(r->seen);
    free(r->buf);
    free(r);
    return hits;
}
