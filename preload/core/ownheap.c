/* The runtime's own heap (see ownheap.h). */
#include "ownheap.h"

#include <stdatomic.h>
#include <stdint.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "spin.h"

/* before every block: 16 bytes, so payloads stay 16-aligned */
typedef struct oh_hdr {
    uint32_t magic; /* OH_LIVE or OH_FREE: a stray or second free is told */
    uint32_t cls;   /* size class, or OH_LARGE */
    size_t size;    /* the payload's bytes */
} oh_hdr;

#define OH_LIVE 0xca95a11cu
#define OH_FREE 0xca95f4eeu
#define OH_LARGE 0xffffffffu

/* a large block's mapping starts with this (its header last) */
typedef struct oh_large {
    struct oh_large *prev, *next; /* the list the leak scan is told */
    size_t maplen;
    size_t pad_;
    oh_hdr h;
} oh_large;

/* an arena starts with this; blocks follow */
typedef struct oh_arena {
    struct oh_arena *next;
    size_t len;
} oh_arena;

#define NCLASS 40
#define MAX_SMALL 32768u
#define ARENA_MIN ((size_t)1 << 20)
#define ARENA_MAX ((size_t)64 << 20)

/* one cache line per class: threads on different classes do not share */
typedef struct oh_class {
    _Alignas(64) cs_spin mu;
    void *free; /* payloads; the first word of each is the next */
} oh_class;

static oh_class cls[NCLASS];
/* the arena being carved and the list of large blocks */
static cs_spin big_mu = CS_SPIN_INIT;
static char *cur, *end;
static size_t narenas;
static oh_large *larges;
/* every arena, newest first: read without a lock by cs_oh_own_memory */
static oh_arena *_Atomic arenas;
static atomic_int told_bad;

_Static_assert(sizeof(oh_hdr) == 16, "payloads 16-aligned");
_Static_assert(sizeof(oh_large) % 16 == 0, "large payloads 16-aligned");
_Static_assert(sizeof(oh_arena) == 16, "arena blocks 16-aligned");

/* up to 128: a class each 16 bytes; above, four a doubling */
static inline unsigned class_of(size_t n)
{
    if (n <= 128)
        return n ? (unsigned)((n - 1) >> 4) : 0;
    unsigned b = 63u - (unsigned)__builtin_clzll((unsigned long long)(n - 1)); /* 2^b < n */
    return 8u + (b - 7u) * 4u + (unsigned)((n - 1 - ((size_t)1 << b)) >> (b - 2));
}

static inline size_t class_size(unsigned c)
{
    if (c < 8)
        return (size_t)(c + 1) << 4;
    unsigned b = 7u + (c - 8u) / 4u;
    return ((size_t)1 << b) + (size_t)((c - 8u) % 4u + 1u) * ((size_t)1 << (b - 2));
}

static inline oh_hdr *hdr_of(const void *p) { return (oh_hdr *)((char *)(uintptr_t)p - sizeof(oh_hdr)); }

static void *map(size_t len)
{
    void *m = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE,
                   -1, 0);
    return m == MAP_FAILED ? NULL : m;
}

/* a free of p that is not a live block of this heap: said once, left
 * alone (a list it joined twice would hand it out twice) */
static void bad_free(const void *p)
{
    if (atomic_exchange(&told_bad, 1))
        return;
    char line[160];
    static const char hex[] = "0123456789abcdef";
    char addr[19] = "0x";
    uintptr_t a = (uintptr_t)p;
    for (int i = 0; i < 16; i++)
        addr[2 + i] = hex[(a >> (60 - 4 * i)) & 15];
    addr[18] = 0;
    /* no stdio: a FILE allocates */
    size_t k = 0;
    const char *parts[] = {"capsan: internal: ", addr,
                           " freed, but no live block of capsan's heap has it (freed twice?): "
                           "left alone\n"};
    for (size_t i = 0; i < 3; i++)
        for (const char *s = parts[i]; *s && k < sizeof line; s++)
            line[k++] = *s;
    ssize_t w = write(2, line, k);
    (void)w;
}

/* A new block of class c from the arena, a new arena when it is used up
 * (its tail, less than a block, is left). */
static void *carve(unsigned c)
{
    size_t sz = class_size(c), need = sizeof(oh_hdr) + sz;
    cs_spin_lock(&big_mu);
    if (!cur || (size_t)(end - cur) < need) {
        /* arenas grow with the heap: fewer mappings for the scan to skip */
        size_t len = ARENA_MIN << (narenas / 4 < 6 ? narenas / 4 : 6);
        if (len > ARENA_MAX)
            len = ARENA_MAX;
        oh_arena *a = map(len);
        if (!a) {
            cs_spin_unlock(&big_mu);
            return NULL;
        }
        a->len = len;
        a->next = atomic_load_explicit(&arenas, memory_order_relaxed);
        atomic_store_explicit(&arenas, a, memory_order_release);
        narenas++;
        cur = (char *)(a + 1);
        end = (char *)a + len;
    }
    oh_hdr *h = (oh_hdr *)cur;
    cur += need;
    cs_spin_unlock(&big_mu);
    h->cls = c;
    h->size = sz;
    return h + 1;
}

static void *large_alloc(size_t n)
{
    if (n > SIZE_MAX / 2)
        return NULL;
    size_t len = (n + sizeof(oh_large) + 4095) & ~(size_t)4095;
    oh_large *l = map(len);
    if (!l)
        return NULL;
    l->maplen = len;
    l->h = (oh_hdr){OH_LIVE, OH_LARGE, len - sizeof(oh_large)};
    cs_spin_lock(&big_mu);
    l->prev = NULL;
    l->next = larges;
    if (larges)
        larges->prev = l;
    larges = l;
    cs_spin_unlock(&big_mu);
    return l + 1;
}

static void large_free(oh_hdr *h)
{
    oh_large *l = (oh_large *)((char *)h - offsetof(oh_large, h));
    cs_spin_lock(&big_mu);
    if (l->prev)
        l->prev->next = l->next;
    else
        larges = l->next;
    if (l->next)
        l->next->prev = l->prev;
    cs_spin_unlock(&big_mu);
    munmap(l, l->maplen);
}

void *cs_oh_malloc(size_t n)
{
    if (n > MAX_SMALL)
        return large_alloc(n);
    unsigned c = class_of(n);
    oh_class *k = &cls[c];
    cs_spin_lock(&k->mu);
    void *p = k->free;
    if (p)
        k->free = *(void **)p;
    cs_spin_unlock(&k->mu);
    if (!p && !(p = carve(c)))
        return NULL;
    hdr_of(p)->magic = OH_LIVE;
    return p;
}

void cs_oh_free(void *p)
{
    if (!p)
        return;
    oh_hdr *h = hdr_of(p);
    if (h->magic != OH_LIVE) {
        bad_free(p);
        return;
    }
    if (h->cls == OH_LARGE) {
        h->magic = OH_FREE;
        large_free(h);
        return;
    }
    if (h->cls >= NCLASS) {
        bad_free(p);
        return;
    }
    h->magic = OH_FREE;
    oh_class *k = &cls[h->cls];
    cs_spin_lock(&k->mu);
    *(void **)p = k->free;
    k->free = p;
    cs_spin_unlock(&k->mu);
}

void *cs_oh_calloc(size_t k, size_t n)
{
    if (n && k > SIZE_MAX / n)
        return NULL;
    void *p = cs_oh_malloc(k * n);
    /* a large block is a fresh mapping: zero already */
    if (p && hdr_of(p)->cls != OH_LARGE)
        memset(p, 0, k * n);
    return p;
}

void *cs_oh_realloc(void *p, size_t n)
{
    if (!p)
        return cs_oh_malloc(n);
    if (!n) {
        cs_oh_free(p);
        return NULL;
    }
    oh_hdr *h = hdr_of(p);
    if (h->magic != OH_LIVE) {
        bad_free(p);
        return NULL;
    }
    size_t old = h->size;
    /* fits, and not so loosely that shrinking should give memory back */
    if (n <= old && (n > old / 2 || old <= 128))
        return p;
    void *np = cs_oh_malloc(n);
    if (!np)
        return NULL;
    memcpy(np, p, n < old ? n : old);
    cs_oh_free(p);
    return np;
}

char *cs_oh_strdup(const char *s)
{
    size_t n = strlen(s) + 1;
    char *p = cs_oh_malloc(n);
    if (p)
        memcpy(p, s, n);
    return p;
}

size_t cs_oh_usable(const void *p) { return p ? hdr_of(p)->size : 0; }

void cs_oh_fork_lock(int lock)
{
    if (lock) {
        for (int i = 0; i < NCLASS; i++)
            cs_spin_lock(&cls[i].mu);
        cs_spin_lock(&big_mu);
    } else {
        cs_spin_unlock(&big_mu);
        for (int i = NCLASS - 1; i >= 0; i--)
            cs_spin_unlock(&cls[i].mu);
    }
}

void cs_oh_own_memory(void (*fn)(void *ud, const void *p, size_t n), void *ud)
{
    /* arenas are never unmapped: the list is walked without a lock */
    for (oh_arena *a = atomic_load_explicit(&arenas, memory_order_acquire); a; a = a->next)
        fn(ud, a, a->len);
    /* large blocks come and go: copied a batch at a time under the lock,
     * told outside it (fn may allocate one) */
    enum { BATCH = 64 };
    struct {
        const void *p;
        size_t n;
    } b[BATCH];
    for (size_t skip = 0;; skip += BATCH) {
        size_t nb = 0, i = 0;
        cs_spin_lock(&big_mu);
        for (oh_large *l = larges; l && nb < BATCH; l = l->next, i++)
            if (i >= skip) {
                b[nb].p = l;
                b[nb++].n = l->maplen;
            }
        cs_spin_unlock(&big_mu);
        for (size_t j = 0; j < nb; j++)
            fn(ud, b[j].p, b[j].n);
        if (nb < BATCH)
            break;
    }
}
