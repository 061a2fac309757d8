/* What the files of numpy/ share, private to them: NEP 49's handler
 * layout, the list of handlers seen (handlers.c) and the sites of numpy's
 * own free() calls (free_hooks.c). The calls run one way: numpy.c (the
 * Track/Untrack and ContextVar hooks, the hook table) calls handlers.c and
 * free_hooks.c; free_hooks.c and tracing_handler.c call handlers.c.
 * known_of and ctx_bit are inline: the hot path asks them. */
#ifndef CAPSAN_NUMPY_INT_H
#define CAPSAN_NUMPY_INT_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "numpy.h"
#include "spin.h"

/* NEP 49 layout, version 1 (numpy/ndarraytypes.h) */
typedef struct np_allocator {
    void *ctx;
    void *(*malloc)(void *ctx, size_t size);
    void *(*calloc)(void *ctx, size_t nelem, size_t elsize);
    void *(*realloc)(void *ctx, void *ptr, size_t new_size);
    void (*free)(void *ctx, void *ptr, size_t size);
} np_allocator;

typedef struct np_handler {
    char name[127];
    uint8_t version;
    np_allocator allocator;
} np_handler;
_Static_assert(sizeof(np_handler) == 168, "PyDataMem_Handler layout");

/* ---- the handlers seen so far, with a snapshot of each (R28: a
 * handler must be immortal, so any change means it is gone) ---- */
#define MAX_HANDLERS 256
typedef struct known {
    const np_handler *h;
    np_handler snap;
    int gone; /* its functions left the address space: never read it again */
    int device; /* DLPack device type it serves; 0 = plain host memory */
    int ctx_freed; /* free() was called on its ctx */
    int freed; /* free() was called on the struct itself: never read it again */
    size_t head; /* the bytes of snap that say which handler it is: its name
                  * up to its NUL, the NUL, then up to the allocator */
    /* a name of up to 24 bytes (head) as three words to compare: each
     * masked to the bytes that count, and snap's words so masked */
    uint64_t nm_mask[3], nm_want[3];
} known;

/* ---- handlers.c ---- */
extern known handlers[MAX_HANDLERS];
extern int nhandlers;
extern int any_device; /* some handler serves another device: check exports */
extern cs_spin hmu;
/* odd while a section that may change an entry runs, bumped again after
 * it: staleness() reads an unchanged list without the lock */
extern _Atomic unsigned handlers_gen;
void hmu_lock(void);
void hmu_unlock(void);
/* the ctx pointers of known handlers, as bits of a 4096-bit filter: every
 * free() of the process tests one bit before taking hmu */
extern _Atomic uint64_t ctx_bits[64];

static inline unsigned ctx_bit(uintptr_t p)
{
    return (unsigned)(((uint64_t)(p >> 4) * 0x9e3779b97f4a7c15ull) >> 52);
}

void watch_ctx(const void *ctx);

static inline known *known_of(const np_handler *h)
{
    for (int i = 0; i < nhandlers; i++)
        if (handlers[i].h == h)
            return &handlers[i];
    return NULL;
}

uint32_t validate(const char *capname, const np_handler *h); /* R27 */
void remember_as(const np_handler *h, int refresh);
void remember(const np_handler *h);
void forget(const np_handler *h);
void note_ctx_free(uintptr_t p); /* free() of a handler's ctx or struct */

/* ---- orphans.c ---- */
/* the handler just died (why: CS_STALE_*): each live block it made is
 * reported stale now */
void cs_np_orphans(const void *handler, uint32_t why);

/* ---- free_hooks.c ---- */
/* where numpy's array_dealloc calls free() (see hook_free): the return
 * addresses of its free() calls, 0 until learned */
#define MAX_FREE_SITES 4
extern _Atomic uintptr_t free_sites[MAX_FREE_SITES];
extern int dealloc_known; /* learned, or given up: learn_dealloc stops */
void learn_dealloc(void);
void hook_free(void *p);
void hook_np_free(void *p);

#endif
