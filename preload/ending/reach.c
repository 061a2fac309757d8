/* Reachability at _exit (reach.h). */
#include "reach.h"
#include "ftdead.h"
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

#include "alloc.h"
#include "sort.h"

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
    unsigned char *buf; /* a window (WIN bytes) at a time is copied here */
    uintptr_t type_type; /* &PyType_Type: a dead object's type is one */
    size_t ft_head;      /* a free-threaded build's ob_type offset, else 0 */
};

#define BUF CS_POOL_SIZE
/* A window: what one mincore() and one read cover. Memory is scanned a
 * pool-sized chunk at a time, but asking the kernel a chunk at a time
 * made a per-test scan (pytest --capsan) two syscalls for every 16 KiB of
 * address space: pyarrow's reserved heaps alone were 70,000 mincore()
 * calls, 130 ms a scan. */
#define WIN_CHUNKS 64
#define WIN (BUF * WIN_CHUNKS)
#define PG 4096u

cs_reach *cs_reach_new(const uint64_t *keys, size_t n)
{
    cs_reach *r = cs_calloc(1, sizeof *r);
    if (!r)
        return NULL;
    r->keys = keys;
    r->n = n;
    if (!(r->seen = cs_calloc(n ? n : 1, 1))) {
        cs_free(r);
        return NULL;
    }
    if (!(r->buf = cs_malloc(WIN))) {
        cs_free(r->seen);
        cs_free(r);
        return NULL;
    }
    cs_reach_own(r, keys, n * sizeof *keys);
    cs_reach_own(r, r->seen, n ? n : 1);
    cs_reach_own(r, r->buf, WIN);
    r->type_type = (uintptr_t)dlsym(RTLD_DEFAULT, "PyType_Type");
    r->ft_head = cs_py.ob_type_off == 24 ? 24 : 0;
    return r;
}

void cs_reach_own(void *reach, const void *p, size_t n)
{
    cs_reach *r = reach;
    if (!p || !n)
        return;
    if (r->nown == r->capown) {
        size_t nc = r->capown ? r->capown * 2 : 256;
        range *o = cs_realloc(r->own, nc * sizeof *o);
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
 * pymalloc block's (block != 0) are not roots if it is a dead object, nor
 * (free-threaded builds) a word inside a dead object of mimalloc's pages */
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
            if (r->ft_head && r->region == CS_WHERE_ANON &&
                cs_ft_word_in_dead_object((const uint64_t *)a, (size_t)(p - (const uint64_t *)a),
                                          r->type_type, r->ft_head))
                continue;
            r->seen[i] = 1;
            cb(ud, w, (uint64_t)at, 0, r->region);
        }
    }
}

/* whether the pool-sized chunk at `chunk` has a resident page, by the
 * mincore() vector of the window at `win` */
static int chunk_resident(const unsigned char *vec, uintptr_t win, uintptr_t chunk)
{
    for (uintptr_t pg = chunk; pg < chunk + BUF; pg += PG)
        if (vec[(pg - win) / PG] & 1)
            return 1;
    return 0;
}

/* The resident pages of [lo, hi), within the window at `win`, copied into
 * r->buf at their offset from `win` by one process_vm_readv(); page by
 * page when it comes up short (another thread unmapped a page meanwhile:
 * a thread's stack as it exits), a page that cannot be read then counting
 * as untouched. Copied, not read in place, for that reason. A chunk with
 * a resident page has its other pages zeroed (an untouched page holds
 * zeros); a chunk with none is not scanned and not written. How many
 * pages were copied. */
static size_t copy_window(cs_reach *r, uintptr_t win, uintptr_t lo, uintptr_t hi,
                          unsigned char *vec)
{
    struct iovec local[WIN / PG / 2 + 1], remote[WIN / PG / 2 + 1];
    size_t niov = 0, want = 0, pages = 0;
    for (uintptr_t pg = lo & ~(uintptr_t)(PG - 1); pg < hi; pg += PG) {
        uintptr_t a = pg < lo ? lo : pg, b = pg + PG > hi ? hi : pg + PG;
        unsigned char *dst = r->buf + (a - win);
        if (!(vec[(pg - win) / PG] & 1)) {
            if (chunk_resident(vec, win, pg & ~(uintptr_t)(BUF - 1)))
                memset(dst, 0, b - a);
            continue;
        }
        if (niov && (uintptr_t)remote[niov - 1].iov_base + remote[niov - 1].iov_len == a) {
            local[niov - 1].iov_len += b - a;
            remote[niov - 1].iov_len += b - a;
        } else {
            local[niov] = (struct iovec){dst, b - a};
            remote[niov] = (struct iovec){(void *)a, b - a};
            niov++;
        }
        want += b - a;
        pages++;
    }
    if (!niov || process_vm_readv(getpid(), local, niov, remote, niov, 0) == (ssize_t)want)
        return pages;
    pages = 0;
    for (uintptr_t pg = lo & ~(uintptr_t)(PG - 1); pg < hi; pg += PG) {
        uintptr_t a = pg < lo ? lo : pg, b = pg + PG > hi ? hi : pg + PG;
        unsigned char *v = &vec[(pg - win) / PG];
        if (!(*v & 1))
            continue;
        struct iovec l1 = {r->buf + (a - win), b - a}, r1 = {(void *)a, b - a};
        if (process_vm_readv(getpid(), &l1, 1, &r1, 1, 0) == (ssize_t)(b - a)) {
            pages++;
        } else {
            memset(l1.iov_base, 0, b - a);
            *v &= (unsigned char)~1u; /* as if untouched */
        }
    }
    return pages;
}

/* A pymalloc pool (its copy at `copy`): its carved blocks that are
 * neither free nor dead */
static void scan_pool(cs_reach *r, const cs_pool *pl, const unsigned char *copy, uintptr_t chunk,
                      cs_root_cb cb, void *ud)
{
    for (uint32_t off = pl->first, k = 0; off + pl->bs <= pl->end; off += pl->bs, k++)
        if (!cs_pool_block_free(pl, k))
            scan_words(r, (uintptr_t)copy + off, (uintptr_t)copy + off + pl->bs, chunk + off, cb,
                       ud, 1);
}

/* [a, b), resident pages only: an untouched anonymous page holds zeros,
 * and reading it would map it. In anonymous memory, a pymalloc pool's
 * free blocks and dead objects are not scanned (pypools.h). */
static void scan_resident(cs_reach *r, uintptr_t a, uintptr_t b, cs_root_cb cb, void *ud)
{
    unsigned char vec[WIN / PG];
    a = (a + 7) & ~(uintptr_t)7; /* whole aligned words: the copy's are the memory's */
    b &= ~(uintptr_t)7;
    for (uintptr_t win = a & ~(uintptr_t)(BUF - 1); win < b; win += WIN) {
        uintptr_t lo = win < a ? a : win, hi = win + WIN > b ? b : win + WIN;
        uintptr_t pa = lo & ~(uintptr_t)(PG - 1);
        size_t npg = (hi - pa + PG - 1) / PG;
        memset(vec, 0, sizeof vec); /* pages outside [lo, hi) count as untouched */
        if (mincore((void *)pa, npg * PG, vec + (pa - win) / PG) != 0)
            memset(vec + (pa - win) / PG, 1, npg); /* unknown: scan it */
        int any = 0; /* bit 0 says resident; the others are reserved */
        for (size_t i = 0; i < npg && !any; i++)
            any = vec[(pa - win) / PG + i] & 1;
        if (!any || !copy_window(r, win, lo, hi, vec))
            continue;
        for (uintptr_t chunk = win; chunk < hi; chunk += BUF) {
            uintptr_t clo = chunk < lo ? lo : chunk, chi = chunk + BUF > hi ? hi : chunk + BUF;
            if (clo >= chi || !chunk_resident(vec, win, chunk))
                continue;
            const unsigned char *copy = r->buf + (chunk - win);
            cs_pool pl;
            if (r->region == CS_WHERE_ANON && clo == chunk && chi == chunk + BUF &&
                (vec[(chunk - win) / PG] & 1) && cs_pool_parse(copy, chunk, &pl)) {
                scan_pool(r, &pl, copy, chunk, cb, ud);
                continue;
            }
            scan_words(r, (uintptr_t)copy + (clo - chunk), (uintptr_t)copy + (chi - chunk), clo,
                       cb, ud, 0);
        }
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
    char *buf = cs_malloc(cap);
    while (buf) {
        if (len + 1 == cap) {
            char *nb = cs_realloc(buf, cap * 2);
            if (!nb) {
                cs_free(buf);
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
    cs_sort(r->own, r->nown, sizeof *r->own, cmp_range);
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
    cs_free(maps);
    cs_free(r->own);
    cs_free(r->seen);
    cs_free(r->buf);
    cs_free(r);
    return hits;
}
