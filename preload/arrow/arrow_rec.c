/* Records (see arrow_rec.h): their pool, the quarantine a released one
 * waits in before reuse, and the table of live Arrow capsules. */
#include "arrow_rec.h"

#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "spin.h"
#include "alloc.h"

/* A released record is reused only after QUAR later ones: a stale copy of
 * its struct released late still finds it released. */
#define CHUNK 256
#define QUAR 8192
static cs_spin pool_mu = CS_SPIN_INIT;
static ar_rec *free_list;
static ar_rec *quar[QUAR];
static unsigned qhead, qlen;
/* every chunk, for the scan at exit: records point to records (a kid to
 * its root), which must not make a struct look held */
static ar_rec **chunks;
static size_t nchunks, capchunks;

ar_rec *cs_ar_rec_alloc(int type)
{
    cs_spin_lock(&pool_mu);
    ar_rec *r = free_list;
    if (r)
        free_list = r->next_free;
    cs_spin_unlock(&pool_mu);
    if (!r) {
        /* never given back (stale copies may read it): pages the kernel
         * zeroes, touched as records are handed out, not cleared here */
        ar_rec *c = mmap(NULL, CHUNK * sizeof *c, PROT_READ | PROT_WRITE,
                         MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (c == MAP_FAILED)
            return NULL;
        cs_spin_lock(&pool_mu);
        if (nchunks == capchunks) {
            size_t nc = capchunks ? capchunks * 2 : 16;
            ar_rec **n = cs_realloc(chunks, nc * sizeof *n);
            if (n) {
                chunks = n;
                capchunks = nc;
            }
        }
        if (nchunks < capchunks)
            chunks[nchunks++] = c;
        /* c[0] is never handed out: a record whose address is its chunk's
         * start (or the end of the chunk mapped just below) would have a
         * copy in every list of address ranges, the exit scan's own among
         * them, and look held by it */
        for (int i = CHUNK - 1; i >= 2; i--) {
            c[i].next_free = free_list;
            free_list = &c[i];
        }
        cs_spin_unlock(&pool_mu);
        r = &c[1];
    }
    memset(r, 0, sizeof *r);
    r->type = (uint8_t)type;
    r->done = DONE_PARENT; /* a kid's is set by its parent */
    __atomic_store_n(&r->magic, AR_MAGIC, __ATOMIC_RELEASE);
    return r;
}

static void rec_retire(ar_rec *r)
{
    cs_spin_lock(&pool_mu);
    if (qlen == QUAR) {
        ar_rec *old = quar[qhead];
        qhead = (qhead + 1) % QUAR;
        qlen--;
        old->next_free = free_list;
        free_list = old;
    }
    quar[(qhead + qlen++) % QUAR] = r;
    cs_spin_unlock(&pool_mu);
}

void cs_ar_rec_done(ar_rec *r, unsigned bits)
{
    unsigned prev = atomic_fetch_or(&r->done, (uint8_t)bits);
    if ((prev | bits) == DONE_ALL && prev != DONE_ALL)
        rec_retire(r);
}

/* ---- live Arrow capsules: capsule -> record (open addressing) ---- */
typedef struct capent {
    PyObject_ *cap;
    ar_rec *rec;
} capent;
static capent *ctab;
static size_t ccap, cused;
static cs_spin ctab_mu = CS_SPIN_INIT;

static size_t chash(const void *cap, size_t cap_)
{
    return (size_t)((((uintptr_t)cap >> 4) * 0x9e3779b97f4a7c15ull) >> 32) & (cap_ - 1);
}

static void ctab_put_locked(PyObject_ *cap, ar_rec *r)
{
    size_t i = chash(cap, ccap);
    while (ctab[i].cap && ctab[i].cap != cap)
        i = (i + 1) & (ccap - 1);
    if (!ctab[i].cap)
        cused++;
    ctab[i] = (capent){cap, r};
}

void cs_ar_ctab_put(PyObject_ *cap, ar_rec *r)
{
    cs_spin_lock(&ctab_mu);
    if ((cused + 1) * 2 > ccap) {
        size_t ncap = ccap ? ccap * 2 : 256;
        capent *n = cs_calloc(ncap, sizeof *n), *old = ctab;
        size_t ocap = ccap;
        if (!n) {
            cs_spin_unlock(&ctab_mu);
            return;
        }
        ctab = n;
        ccap = ncap;
        cused = 0;
        for (size_t i = 0; i < ocap; i++)
            if (old[i].cap)
                ctab_put_locked(old[i].cap, old[i].rec);
        cs_free(old);
    }
    ctab_put_locked(cap, r);
    cs_spin_unlock(&ctab_mu);
}

ar_rec *cs_ar_ctab_get(const PyObject_ *cap, int take)
{
    ar_rec *r = NULL;
    cs_spin_lock(&ctab_mu);
    if (ccap) {
        size_t m = ccap - 1, i = chash(cap, ccap);
        while (ctab[i].cap && ctab[i].cap != cap)
            i = (i + 1) & m;
        if (ctab[i].cap) {
            r = ctab[i].rec;
            if (take) {
                /* backward-shift deletion keeps every probe path whole */
                size_t j = i;
                for (;;) {
                    j = (j + 1) & m;
                    if (!ctab[j].cap)
                        break;
                    size_t home = chash(ctab[j].cap, ccap);
                    if (((j - home) & m) >= ((j - i) & m)) {
                        ctab[i] = ctab[j];
                        i = j;
                    }
                }
                ctab[i] = (capent){0};
                cused--;
            }
        }
    }
    cs_spin_unlock(&ctab_mu);
    return r;
}

void cs_ar_own_memory(void (*fn)(void *ud, const void *p, size_t n), void *ud)
{
    if (ctab)
        fn(ud, ctab, ccap * sizeof *ctab);
    for (size_t i = 0; i < nchunks; i++)
        fn(ud, chunks[i], CHUNK * sizeof *chunks[i]);
    if (chunks)
        fn(ud, chunks, capchunks * sizeof *chunks);
}
