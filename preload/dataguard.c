/* dlpack-data-freed (see dataguard.h).
 *
 * The lifecycle knows which tensors are consumed and where their data
 * lies; it tells the watch below as they come and go (under their stripe
 * lock, no lock of ours). The watch counts where their data starts, by
 * 256-byte granule, and keeps the last start seen in each slot: a free()
 * of a block that cannot hold a data start costs one load (dataguard.h's
 * filter, shared with numpy.c's handler ctx watch), and a block
 * near one costs its size and a compare with that start. Only a block that
 * holds it is looked up against every consumed tensor. A tensor's own
 * deleter frees its data after the tensor was released, so those frees
 * never match.
 * (Two live tensors in one slot: the later one's start is compared.) */
#include "dataguard.h"

#include <dlfcn.h>
#include <malloc.h>

#include "lifecycle.h"
#include "quarantine.h"
#include "runtime.h"
#include "thread.h"
#include "xapi.h"
#include "young.h"

_Atomic uint16_t cs_dg_pages[4096];
/* per slot of a data start's own granule: the live starts there, and the
 * last one (what the slow path compares) */
static _Atomic uint16_t nstarts[4096];
static _Atomic uint64_t starts[4096];

static void watch(uint64_t data, uint64_t n, int sign)
{
    (void)n;
    uintptr_t g = (uintptr_t)(data >> CS_DG_GRAIN);
    unsigned k = cs_dg_page(g);
    if (sign > 0)
        atomic_store_explicit(&starts[k], data, memory_order_relaxed);
    /* wraps only if 65536 live tensors shared a slot: then only more lookups */
    atomic_fetch_add_explicit(&nstarts[k], (uint16_t)sign, memory_order_relaxed);
    atomic_fetch_add_explicit(&cs_dg_pages[k], (uint16_t)sign, memory_order_relaxed);
    atomic_fetch_add_explicit(&cs_dg_pages[cs_dg_page(g - 1)], (uint16_t)sign,
                              memory_order_relaxed);
}

void cs_dg_mark(uintptr_t p)
{
    atomic_fetch_add_explicit(&cs_dg_pages[cs_dg_page(p >> CS_DG_GRAIN)], 1,
                              memory_order_relaxed);
}

void cs_dg_init(void)
{
    cs_lc_data_watch = watch;
}

void cs_dg_check_slow(uintptr_t p, unsigned how)
{
    if (!p || !cs_recording || !cs_lc)
        return;
    /* the block being freed: all of it for malloc's, p itself otherwise */
    size_t span = how == CS_FREED_LIBC ? malloc_usable_size((void *)p) : 1;
    if (!span)
        span = 1;
    /* a watched data start in it? Blocks just below a live tensor's data
     * pass the filter at every free (an exchange loop reuses them), so this
     * is exact before anything is locked or searched */
    uintptr_t g = p >> CS_DG_GRAIN;
    int in = 0;
    for (uintptr_t x = g; x <= g + 1; x++) {
        unsigned k = cs_dg_page(x);
        uint64_t d = atomic_load_explicit(&starts[k], memory_order_relaxed);
        in |= atomic_load_explicit(&nstarts[k], memory_order_relaxed) && d >= p && d - p < span;
    }
    if (!in)
        return;
    uint64_t hit[8];
    cs_young_dl_adopt_data(p, p + span);
    size_t nh = cs_lc_consumed_in(cs_lc, p, p + span, hit, 8);
    for (size_t k = 0; k < nh; k++) {
        /* a view is the caller's only while its call lasts (R53) */
        if (cs_xview_is_view(hit[k]) && !cs_xview_still_valid(hit[k]))
            continue;
        cs_event ev = {.kind = CS_EV_DATA_FREED, .obj = hit[k], .a = p, .aux = (uint16_t)how};
        cs_emit(&ev, 1, NULL, NULL); /* reported before the memory is reused */
    }
}

/* ---- PyMem_Free: a producer's buffers made with PyMem_Malloc ---- */
static void (*real_pymem_free)(void *);

static void hook_pymem_free(void *p)
{
    cs_frees++;
    /* PyMem_* needs the GIL: a deleter torch runs without it may not (R12) */
    if (cs_in_nogil_deleter)
        cs_check_gil(__builtin_return_address(0), CS_NOGIL_CAPSULE);
    cs_dg_check((uintptr_t)p, CS_FREED_PYMEM);
    if (cs_qr_take(p, CS_FREED_PYMEM))
        return; /* a released managed struct: its free waits (quarantine.c) */
    real_pymem_free(p);
}

const cs_hook cs_dg_hooks[] = {
    {"PyMem_Free", (void *)hook_pymem_free, NULL},
};
const int cs_dg_nhooks = sizeof cs_dg_hooks / sizeof cs_dg_hooks[0];

int cs_dg_hooks_ready(void)
{
    *(void **)&real_pymem_free = dlsym(RTLD_DEFAULT, "PyMem_Free");
    return real_pymem_free != NULL;
}
