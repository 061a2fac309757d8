/* The NEP 49 handlers seen so far (R27, R28): each one's snapshot, its
 * device, whether its ctx or the struct itself was freed (the ctx filter
 * every free() tests), and the handler numpy just read on this thread.
 * numpy.c's per-block checks read this list. */
#include "numpy_int.h"

#include <string.h>

#include "dltensor.h"
#include "freefilter.h"
#include "plausible.h"
#include "runtime.h"
#include "young.h"

known handlers[MAX_HANDLERS];
int nhandlers;
int any_device; /* some handler serves another device: check exports */
cs_spin hmu = CS_SPIN_INIT;
_Atomic unsigned handlers_gen;

void hmu_lock(void)
{
    cs_spin_lock(&hmu);
    atomic_fetch_add_explicit(&handlers_gen, 1, memory_order_relaxed);
    atomic_thread_fence(memory_order_release);
}

void hmu_unlock(void)
{
    atomic_fetch_add_explicit(&handlers_gen, 1, memory_order_release);
    cs_spin_unlock(&hmu);
}

/* the ctx pointers of known handlers, as bits of a 4096-bit filter: every
 * free() of the process tests one bit before taking hmu */
_Atomic uint64_t ctx_bits[64];

void watch_ctx(const void *ctx)
{
    if (ctx) {
        unsigned b = ctx_bit((uintptr_t)ctx);
        if (!(atomic_fetch_or(&ctx_bits[b >> 6], 1ull << (b & 63)) & (1ull << (b & 63))))
            cs_ff_mark((uintptr_t)ctx); /* free() asks here only past the free() filter */
    }
}

/* the handler numpy read last on this thread (numpy.h) */
__thread cs_np_cur_t cs_np_cur __attribute__((tls_model("initial-exec")));

/* R27: a handler numpy will call must be whole. */
uint32_t validate(const char *capname, const np_handler *h)
{
    if (!capname || strcmp(capname, "mem_handler") != 0)
        return CS_BAD_HANDLER_NAME;
    if (!cs_plausible(h))
        return CS_BAD_HANDLER_NULL_FN;
    if (!memchr(h->name, 0, sizeof h->name))
        return CS_BAD_HANDLER_UNTERMINATED;
    if (h->version != 1)
        return CS_BAD_HANDLER_VERSION;
    if (!h->allocator.malloc || !h->allocator.calloc || !h->allocator.realloc ||
        !h->allocator.free)
        return CS_BAD_HANDLER_NULL_FN;
    return 0;
}

/* A handler's name as a string and its version: what a free compares
 * (the bytes after the name's NUL say nothing) */
static size_t head_of(const np_handler *h)
{
    return strnlen(h->name, sizeof h->name) + 1;
}

/* k->head and the words a free compares, from k->snap (the struct is 168
 * bytes: its first 24 can always be read) */
static void set_head(known *k)
{
    k->head = head_of(&k->snap);
    for (size_t w = 0; w < 3; w++) {
        size_t in = k->head > 8 * w ? k->head - 8 * w : 0;
        k->nm_mask[w] = in >= 8 ? ~0ull : in ? ~0ull >> (64 - 8 * in) : 0;
        uint64_t v;
        memcpy(&v, k->snap.name + 8 * w, 8);
        k->nm_want[w] = v & k->nm_mask[w];
    }
}

/* First sight of a handler: remember it as it is now. `refresh`: it is
 * being installed, so what is there now is the handler (an address may
 * be reused by a new handler after the old one was freed). */
void remember_as(const np_handler *h, int refresh)
{
    hmu_lock();
    known *k = known_of(h);
    if (k && refresh && !k->gone) {
        memcpy(&k->snap, h, sizeof *h);
        set_head(k);
        k->ctx_freed = k->freed = 0;
        watch_ctx(h->allocator.ctx);
    } else if (!k && nhandlers < MAX_HANDLERS) {
        handlers[nhandlers].h = h;
        memcpy(&handlers[nhandlers].snap, h, sizeof *h);
        handlers[nhandlers].gone = 0;
        handlers[nhandlers].ctx_freed = 0;
        handlers[nhandlers].freed = 0;
        set_head(&handlers[nhandlers]);
        watch_ctx(h->allocator.ctx);
        watch_ctx(h); /* a heap handler's own free() (see note_ctx_free) */
        /* names that say what memory they hand out */
        handlers[nhandlers].device = strstr(h->name, "cuda_host") || strstr(h->name, "pinned")
                                         ? 3 /* kDLCUDAHost */
                                         : strstr(h->name, "cuda_managed") ? 13 : 0;
        if (handlers[nhandlers].device)
            any_device = 1;
        nhandlers++;
    }
    hmu_unlock();
}

void remember(const np_handler *h) { remember_as(h, 0); }

void forget(const np_handler *h)
{
    hmu_lock();
    known *k = known_of(h);
    if (k)
        *k = handlers[--nhandlers];
    hmu_unlock();
}

void cs_np_new_handler(const void *handler)
{
    cs_np_cur.handler = handler;
    if (handler && cs_plausible(handler))
        remember(handler);
}

void cs_np_check_export_device(const void *managed, int versioned)
{
    if (!any_device || !cs_lc) /* the usual case: no struct is read */
        return;
    uint64_t mt = (uint64_t)(uintptr_t)managed, data = cs_dl_data(managed);
    if (cs_dl_device_type(managed, versioned) != 1 /* kDLCPU */ || !data)
        return;
    cs_event origin;
    cs_young_adopt(data);
    cs_lc_lock(cs_lc, data);
    int found = cs_lc_origin(cs_lc, CS_NS_NUMPY, data, &origin) &&
                cs_lc_state(cs_lc, CS_NS_NUMPY, data) == CS_ST_CREATED;
    cs_lc_unlock(cs_lc, data);
    if (!found || !origin.c)
        return;
    int dev = 0;
    hmu_lock();
    known *k = known_of((const np_handler *)(uintptr_t)origin.c);
    if (k)
        dev = k->device;
    hmu_unlock();
    if (!dev || dev == 1)
        return;
    /* the finding shows the export (the struct's history) and where the
     * device memory was allocated (this event's stack) */
    cs_event ev = {.kind = CS_EV_DEVICE, .obj = mt, .b = data, .c = origin.c,
                   .aux = (uint16_t)dev, .stack = origin.stack};
    cs_emit(&ev, 0, NULL, NULL);
}

/* free() of a known handler's ctx: its blocks can no longer be freed
 * through it safely (the handler functions still read the ctx); free() of
 * the handler struct itself: it is stale, and is not read again (ASan
 * saw staleness() compare the freed bytes) */
void note_ctx_free(uintptr_t p)
{
    /* the handlers this free() kills, told after hmu is let go (telling
     * them judges blocks under the lifecycle's locks) */
    const void *died[8];
    uint32_t why[8];
    int nd = 0;
    hmu_lock();
    for (int i = 0; i < nhandlers; i++) {
        known *k = &handlers[i];
        int was_whole = !k->gone && !k->freed && !k->ctx_freed;
        if ((uintptr_t)k->snap.allocator.ctx == p && !k->gone)
            k->ctx_freed = 1;
        if ((uintptr_t)k->h == p)
            k->freed = 1;
        if (was_whole && (k->freed || k->ctx_freed) && nd < 8) {
            died[nd] = k->h;
            why[nd++] = k->freed ? CS_STALE_CHANGED : CS_STALE_CTX_FREED;
        }
    }
    hmu_unlock();
    for (int i = 0; i < nd; i++)
        cs_np_orphans(died[i], why[i]);
}
