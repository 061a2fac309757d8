/* Trace file writer (see tracefile.h and reports/FORMAT.md). */
#include "tracefile.h"
#include "tracename.h"
#include "spin.h"

#include <emmintrin.h>
#include <x86intrin.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define CHUNK (8u << 20)
#define MAX_CHUNKS (1u << 16) /* 512 GiB */

static char prefix[512];
static char path[600];
static char abs_path[1200]; /* path from the cwd it was opened in */
static cs_trace_prologue_fn prologue;
static int fd = -1;
static dev_t fd_dev; /* the file fd was opened on: a program may close or */
static ino_t fd_ino; /* dup2 over capsan's descriptor (fd_is_ours) */
static _Atomic int state; /* 0 closed, 1 opening, 2 open, 3 failed */
static _Atomic uint64_t wr_off;
static _Atomic(char *) chunks[MAX_CHUNKS];
static _Atomic uint32_t mapped_upto; /* chunks [0, mapped_upto) exist */
static pthread_mutex_t grow_mu = PTHREAD_MUTEX_INITIALIZER;
_Atomic uint32_t cs_trace_generation = 1;

/* ---- the clock: events are stamped with CLOCK_MONOTONIC nanoseconds,
 * read through the TSC when it is invariant (11 ns instead of 26 here), and
 * re-anchored to the kernel's clock every doubling interval up to ~1 s ---- */
typedef cs_clk clk;

static clk clocks[64];
_Atomic(const cs_clk *) cs_cur_clk;
#define cur_clk cs_cur_clk
static _Atomic unsigned nclk;
static uint64_t anchor_tsc, anchor_ns;
static int tsc_usable = -1;

static uint64_t mono_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static int tsc_invariant(void)
{
    char buf[4096];
    int f = open("/proc/cpuinfo", O_RDONLY | O_CLOEXEC);
    if (f < 0)
        return 0;
    ssize_t n = read(f, buf, sizeof buf - 1);
    close(f);
    if (n <= 0)
        return 0;
    buf[n] = 0;
    return strstr(buf, " constant_tsc") && strstr(buf, " nonstop_tsc");
}

/* The TSC and CLOCK_MONOTONIC read together: the TSC on either side of
 * the kernel's clock, the narrowest of a few tries, the TSC taken at its
 * middle. A thread preempted between two plain reads (a busy machine)
 * would pair a tick with a time milliseconds later, and every time read
 * through that pair would run ahead by as much. */
static void tsc_pair(uint64_t *tsc, uint64_t *ns)
{
    uint64_t best = UINT64_MAX;
    for (int i = 0; i < 4; i++) {
        uint64_t a = __rdtsc(), n = mono_ns(), b = __rdtsc();
        if (b - a < best) {
            best = b - a;
            *tsc = a + (b - a) / 2;
            *ns = n;
        }
        if (best < 2000)
            break;
    }
}

void cs_clock_init(void)
{
    tsc_usable = tsc_invariant();
    tsc_pair(&anchor_tsc, &anchor_ns);
}

/* A new clock from tick t on. It never starts behind where the current
 * one stands at t: stamps only grow (a forked child's objects are told
 * from what it inherited by their stamp against the fork's, young.c
 * orders lives by them), though the current clock ran fast. */
static void reanchor(uint64_t t)
{
    static cs_spin mu = CS_SPIN_INIT;
    cs_spin_lock(&mu);
    const clk *c = atomic_load(&cur_clk);
    if (!c || t >= c->next) {
        unsigned i = atomic_load(&nclk);
        uint64_t tn, ns;
        tsc_pair(&tn, &ns);
        uint64_t dt = tn - anchor_tsc, dns = ns - anchor_ns;
        if (i < 64 && tn > anchor_tsc && dns >= 1000000) {
            clk *n = &clocks[i];
            uint64_t at = c ? c->ns0 + (uint64_t)(((unsigned __int128)(tn - c->tsc0) * c->mult) >> 32)
                            : 0;
            n->tsc0 = tn;
            n->ns0 = ns > at ? ns : at;
            n->mult = (uint64_t)(((unsigned __int128)dns << 32) / dt);
            /* next anchor after twice the span measured so far */
            n->next = tn + (dt < (1ull << 40) ? dt : (1ull << 40));
            atomic_store(&nclk, i + 1);
            atomic_store(&cur_clk, n);
        } else if (i >= 64 && c) {
            ((clk *)c)->next = UINT64_MAX; /* calibrated for good */
        }
    }
    cs_spin_unlock(&mu);
}

uint64_t cs_now_ns_slow(void)
{
    if (tsc_usable <= 0)
        return mono_ns();
    uint64_t t = __rdtsc();
    const clk *c = atomic_load_explicit(&cur_clk, memory_order_acquire);
    if (!c || t >= c->next) {
        reanchor(t);
        c = atomic_load_explicit(&cur_clk, memory_order_acquire);
        if (!c)
            return mono_ns(); /* the first millisecond: not calibrated yet */
        t = __rdtsc(); /* past the new clock's tick, which was read after t */
        if (t < c->tsc0)
            t = c->tsc0;
    }
    return c->ns0 + (uint64_t)(((unsigned __int128)(t - c->tsc0) * c->mult) >> 32);
}

void cs_trace_init(const char *p, cs_trace_prologue_fn fn)
{
    snprintf(prefix, sizeof prefix, "%s", p);
    prologue = fn;
}

const char *cs_trace_path(void) { return atomic_load(&state) == 2 ? path : ""; }
const char *cs_trace_abs_path(void) { return atomic_load(&state) == 2 ? abs_path : ""; }
int cs_trace_started(void) { return atomic_load(&state) == 2; }
int cs_trace_failed(void) { return atomic_load(&state) == 3; }

/* Move a fresh descriptor to 3 or above (a program that closed stdin,
 * stdout or stderr must not find the trace there) and remember its file. */
static int settle_fd(int f)
{
    if (f >= 0 && f < 3) {
        int hi = fcntl(f, F_DUPFD_CLOEXEC, 3);
        close(f);
        f = hi;
    }
    struct stat st;
    if (f >= 0 && fstat(f, &st) == 0) {
        fd_dev = st.st_dev;
        fd_ino = st.st_ino;
    }
    return f;
}

/* descriptor f is open on the trace file */
static int is_trace(int f)
{
    struct stat st;
    return f >= 0 && fstat(f, &st) == 0 && st.st_dev == fd_dev && st.st_ino == fd_ino;
}

/* fd is still the trace file (the program may have closed it, or dup2'd
 * one of its own files over it); if not, open the trace again by path */
static int fd_is_ours(void)
{
    if (is_trace(fd))
        return 1;
    int f = open(path, O_RDWR | O_CLOEXEC);
    if (is_trace(f)) {
        fd = settle_fd(f);
        return fd >= 0;
    }
    if (f >= 0)
        close(f);
    return 0;
}

/* Map chunk k (and grow the file to hold it); grow_mu held. `populate`:
 * fault its pages in ahead of the writers. */
static int map_chunk_as(uint32_t k, int populate)
{
    if (atomic_load(&chunks[k]))
        return 0;
    if (!fd_is_ours() || ftruncate(fd, (off_t)(k + 1) * CHUNK) != 0)
        return -1;
    void *m = mmap(NULL, CHUNK, PROT_READ | PROT_WRITE, MAP_SHARED, fd, (off_t)k * CHUNK);
    if (m == MAP_FAILED)
        return -1;
    /* MAP_POPULATE read-faults a shared mapping, so every first write would
     * still fault: populate for writing in bulk, ahead of the writers
     * (Linux >= 5.14; older kernels just take the faults) */
    if (populate)
        madvise(m, CHUNK, 23 /* MADV_POPULATE_WRITE */);
    atomic_store(&chunks[k], (char *)m);
    if (k + 1 > atomic_load(&mapped_upto))
        atomic_store(&mapped_upto, k + 1);
    return 0;
}

static int map_chunk(uint32_t k) { return map_chunk_as(k, 1); }

/* `crash`: from a crash handler (cs_trace_open_crash): quiet, and no lock
 * (state 1 keeps every other writer out: nothing maps a chunk before the
 * file is open) */
static int open_file(int crash)
{
    if (cs_trace_name(path, sizeof path, prefix, (long)getpid()) != 0) {
        /* log_path=/dev/null or stderr: no file, by request (tracename.h) */
        if (!crash && !cs_log_path_none(prefix))
            dprintf(2, "capsan: log_path %s is too long; tracing to disk is off\n", prefix);
        return -1;
    }
    /* as the crash report names it: the program may chdir before it dies */
    if (path[0] != '/' && getcwd(abs_path, sizeof abs_path - sizeof path - 1))
        strcat(abs_path, "/");
    else
        abs_path[0] = 0;
    strcat(abs_path, path);
    fd = settle_fd(open(path, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0644));
    if (fd < 0) {
        if (!crash)
            dprintf(2, "capsan: cannot create trace file %s: %s; tracing to disk is off\n", path,
                    strerror(errno));
        return -1;
    }
    if (!crash)
        pthread_mutex_lock(&grow_mu);
    int rc = map_chunk_as(0, !crash);
    if (!crash)
        pthread_mutex_unlock(&grow_mu);
    if (rc != 0) {
        if (!crash)
            dprintf(2, "capsan: cannot map trace file %s: %s\n", path, strerror(errno));
        close(fd);
        fd = -1;
        return -1;
    }
    cs_file_header *h = (cs_file_header *)atomic_load(&chunks[0]);
    struct timespec rt;
    clock_gettime(CLOCK_REALTIME, &rt);
    h->version = CS_TRACE_VERSION;
    h->header_size = sizeof *h;
    h->pid = (uint64_t)getpid();
    h->ppid = (uint64_t)getppid();
    h->start_realtime_ns = (uint64_t)rt.tv_sec * 1000000000ull + (uint64_t)rt.tv_nsec;
    h->start_mono_ns = mono_ns();
    memcpy(h->magic, CS_TRACE_MAGIC, 8);
    atomic_store(&wr_off, sizeof *h);
    return 0;
}

/* First writer opens the file; others wait for it (once per process). */
static int ensure_open(void)
{
    int s = atomic_load_explicit(&state, memory_order_acquire);
    if (s == 2)
        return 0;
    if (s == 3)
        return -1;
    int expect = 0;
    if (atomic_compare_exchange_strong(&state, &expect, 1)) {
        if (open_file(0) != 0) {
            atomic_store(&state, 3);
            return -1;
        }
        atomic_store_explicit(&state, 2, memory_order_release);
        if (prologue)
            prologue();
        return 0;
    }
    while ((s = atomic_load_explicit(&state, memory_order_acquire)) == 1)
        sched_yield();
    return s == 2 ? 0 : -1;
}

int cs_trace_open_crash(cs_trace_prologue_fn fn)
{
    int expect = 0;
    if (atomic_compare_exchange_strong(&state, &expect, 1)) {
        if (open_file(1) != 0) {
            atomic_store(&state, 3);
            return 0;
        }
        atomic_store_explicit(&state, 2, memory_order_release);
        if (fn)
            fn();
        return 1;
    }
    /* another thread is opening it (or this one was, and crashed there) */
    struct timespec ms = {0, 1000000};
    for (int i = 0; i < 200 && atomic_load(&state) == 1; i++)
        nanosleep(&ms, NULL);
    return atomic_load(&state) == 2;
}

static void pad(char *at, uint32_t n)
{
    cs_rec *r = (cs_rec *)at;
    r->flags = 0;
    r->size = n;
    atomic_store_explicit((_Atomic uint16_t *)&r->type, CS_REC_PAD, memory_order_release);
}

static char *chunk_ptr(uint32_t k)
{
    char *c = atomic_load_explicit(&chunks[k], memory_order_acquire);
    if (c)
        return c;
    pthread_mutex_lock(&grow_mu);
    int rc = map_chunk(k);
    pthread_mutex_unlock(&grow_mu);
    return rc == 0 ? atomic_load(&chunks[k]) : NULL;
}

/* Reserve `size` bytes (a multiple of 64) of the file; NULL if unusable. */
static char *reserve(size_t size)
{
    if (size > CHUNK / 2 || ensure_open() != 0)
        return NULL;
    for (;;) {
        uint64_t off = atomic_fetch_add_explicit(&wr_off, size, memory_order_relaxed);
        uint64_t k = off / CHUNK, kend = (off + size - 1) / CHUNK;
        if (kend >= MAX_CHUNKS)
            return NULL;
        if (k != kend) {
            /* a record never straddles two mappings: fill both sides */
            char *a = chunk_ptr((uint32_t)k), *b = chunk_ptr((uint32_t)kend);
            if (!a || !b)
                return NULL;
            pad(a + off % CHUNK, (uint32_t)(CHUNK - off % CHUNK));
            pad(b, (uint32_t)((off + size) % CHUNK));
            continue;
        }
        char *c = chunk_ptr((uint32_t)k);
        if (!c)
            return NULL;
        /* past half of the last mapped chunk: map the next one ahead */
        if (off % CHUNK >= CHUNK / 2 && atomic_load(&mapped_upto) == k + 1 &&
            k + 1 < MAX_CHUNKS)
            chunk_ptr((uint32_t)k + 1);
        return c + off % CHUNK;
    }
}

void *cs_trace_begin(uint16_t type, size_t payload, cs_rec **hdr_out)
{
    (void)type;
    /* every record is whole cache lines: events are exactly one, written
     * with non-temporal stores (see cs_trace_write) */
    size_t size = (sizeof(cs_rec) + payload + 63) & ~(size_t)63;
    cs_rec *r = (cs_rec *)reserve(size);
    if (!r)
        return NULL;
    r->flags = 0;
    r->size = (uint32_t)size;
    *hdr_out = r;
    return r + 1;
}

void cs_trace_commit(cs_rec *hdr, uint16_t type)
{
    /* the type goes last: a record cut short by SIGKILL reads as the end */
    atomic_store_explicit((_Atomic uint16_t *)&hdr->type, type, memory_order_release);
}

int cs_trace_write(uint16_t type, const void *payload, size_t n)
{
    cs_rec *h;
    if (n == 64 - sizeof(cs_rec)) {
        /* one cache line (events): streaming stores skip the read-for-
         * ownership of a line nobody will read again; the header half goes
         * last, so a record cut short reads as the end of the data */
        h = (cs_rec *)reserve(64);
        if (!h)
            return -1;
        __attribute__((aligned(16))) unsigned char line[64];
        cs_rec hdr = {.type = type, .flags = 0, .size = 64};
        memcpy(line, &hdr, sizeof hdr);
        memcpy(line + sizeof hdr, payload, n);
        __m128i *dst = (__m128i *)h;
        const __m128i *src = (const __m128i *)line;
        _mm_stream_si128(dst + 3, _mm_load_si128(src + 3));
        _mm_stream_si128(dst + 2, _mm_load_si128(src + 2));
        _mm_stream_si128(dst + 1, _mm_load_si128(src + 1));
        _mm_stream_si128(dst, _mm_load_si128(src));
        return 0;
    }
    void *p = cs_trace_begin(type, n, &h);
    if (!p)
        return -1;
    memcpy(p, payload, n);
    cs_trace_commit(h, type);
    return 0;
}

int cs_trace_write_strs(uint16_t type, const void *fixed, size_t n, const char *const *strs,
                        int nstrs)
{
    size_t total = n;
    for (int i = 0; i < nstrs; i++)
        total += strlen(strs[i] ? strs[i] : "") + 1;
    cs_rec *h;
    char *p = cs_trace_begin(type, total, &h);
    if (!p)
        return -1;
    memcpy(p, fixed, n);
    p += n;
    for (int i = 0; i < nstrs; i++) {
        const char *s = strs[i] ? strs[i] : "";
        size_t l = strlen(s) + 1;
        memcpy(p, s, l);
        p += l;
    }
    cs_trace_commit(h, type);
    return 0;
}

void cs_trace_atfork_child(void)
{
    /* the parent's mappings are MAP_SHARED: writing there would corrupt
     * its file. Forget them; the child's first record opens its own. */
    for (uint32_t k = 0; k < atomic_load(&mapped_upto); k++) {
        char *c = atomic_load(&chunks[k]);
        if (c)
            munmap(c, CHUNK);
        atomic_store(&chunks[k], NULL);
    }
    atomic_store(&mapped_upto, 0);
    if (is_trace(fd)) /* the program may have closed or dup2'd over it */
        close(fd);
    fd = -1;
    atomic_store(&wr_off, 0);
    atomic_store(&state, 0);
    atomic_fetch_add(&cs_trace_generation, 1);
}

void cs_trace_close(void)
{
    if (atomic_load(&state) != 2)
        return;
    uint32_t n = atomic_load(&mapped_upto);
    for (uint32_t k = 0; k < n; k++) {
        char *c = atomic_load(&chunks[k]);
        if (c)
            msync(c, CHUNK, MS_ASYNC);
    }
    /* give back the disk blocks of the unwritten tail (the chunks were
     * populated ahead of the writers). The file keeps its size and the
     * mappings stay valid; a margin is left for threads still writing. */
    uint64_t from = (atomic_load(&wr_off) + (256u << 10) + 4095) & ~(uint64_t)4095;
    uint64_t end = (uint64_t)n * CHUNK;
    if (from < end && fd_is_ours())
        fallocate(fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, (off_t)from, (off_t)(end - from));
}

void cs_trace_fork_lock(int lock)
{
    if (lock)
        pthread_mutex_lock(&grow_mu);
    else
        pthread_mutex_unlock(&grow_mu);
}
