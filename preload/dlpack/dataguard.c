/* dlpack-data-freed (see dataguard.h).
 *
 * The lifecycle knows which tensors are consumed and where their data
 * lies; it tells the watch below as they come and go (under their stripe
 * lock). The watch counts where their data starts, by 256-byte granule,
 * and keeps each start in the consumed-data index (dataindex.c): a free()
 * of a block that cannot hold a data start costs one load (freefilter.h's
 * filter, shared with handlers.c's handler ctx watch), and a block near one
 * an index lookup. A tensor's own deleter frees its data after the tensor
 * was released, so those frees never match. */
#include "dataguard.h"

#include <dlfcn.h>
#include <link.h>
#include <malloc.h>
#include <string.h>

#include "dataindex.h"
#include "lifecycle.h"
#include "quarantine.h"
#include "runtime.h"
#include "thread.h"
#include "xview.h"
#include "young.h"

int cs_dg_glibc;

size_t cs_dg_usable(uintptr_t p)
{
    return malloc_usable_size((void *)p);
}

static void watch(uint64_t key, uint64_t data, uint64_t n, int sign)
{
    (void)n;
    atomic_fetch_add_explicit(&cs_ff_watched, (uint32_t)sign, memory_order_relaxed);
    if (sign > 0)
        cs_di_add(data, key);
    else
        cs_di_remove(data, key);
    uintptr_t g = (uintptr_t)(data >> CS_FF_GRAIN);
    /* wraps only if 65536 live tensors shared a slot: then only more lookups */
    cs_ff_count(g, sign);
    cs_ff_count(g - 1, sign);
}

void cs_dg_init(void)
{
    /* glibc's malloc, not one the program brings (jemalloc, mimalloc...):
     * then a block's size is read in its chunk header */
    Dl_info di;
    const ElfW(Sym) *sym = NULL;
    void *m = dlsym(RTLD_DEFAULT, "malloc");
    /* a non-PIE executable (Debian's python3) answers with its PLT entry,
     * an undefined symbol: the definition lies further on */
    if (m && dladdr1(m, &di, (void **)&sym, RTLD_DL_SYMENT) && sym && sym->st_shndx == SHN_UNDEF)
        m = dlsym(RTLD_NEXT, "malloc");
    cs_dg_glibc = m && dladdr(m, &di) && di.dli_fname && strstr(di.dli_fname, "/libc.so");
    cs_lc_data_watch = watch;
}

void cs_dg_check_slow(uintptr_t p, unsigned how)
{
    if (!p || !cs_recording || !cs_lc)
        return;
    /* The filter counts a data start in its granule and the one before:
     * the starts it may have let through lie in [p, the end of the next
     * granule). The index says exactly which are there, before the
     * block's size is asked (most blocks that pass hold none). */
    uint64_t hit[8];
    uint64_t near = (((uint64_t)p >> CS_FF_GRAIN) + 2) << CS_FF_GRAIN;
    size_t nh;
    if (how == CS_FREED_LIBC && cs_dg_big(p)) {
        /* a block that reaches past the filter's granules: every start in
         * it, found in the index's order (an arena freed whole) */
        size_t span = malloc_usable_size((void *)p);
        nh = cs_di_starts_in(p, p + (span ? span : 1), hit, 8);
    } else {
        nh = cs_di_starts_in(p, near, hit, 8);
        if (!nh)
            return;
        /* the block being freed: all of it for malloc's, p itself otherwise */
        size_t span = how == CS_FREED_LIBC ? malloc_usable_size((void *)p) : 1;
        if (!span)
            span = 1;
        if (span < near - p)
            nh = cs_di_starts_in(p, p + span, hit, 8);
    }
    for (size_t k = 0; k < nh; k++) {
        cs_young_dl_adopt(hit[k]); /* the event goes to the lifecycle */
        if (cs_xview_is_view(hit[k])) {
            cs_xview_freed(hit[k], p, how); /* judged by xview.c (R53) */
            continue;
        }
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
