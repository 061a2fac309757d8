/* Holders of moved streams (see arrow_home.h). A consumer moves a stream
 * out of its capsule into a struct of its own (on the heap, often) and
 * calls it there; capsan learns that address from the callbacks, keeps
 * the last one per stream in a small table and marks it in the free()
 * filter. When that block is freed with the stream still in it (release
 * set, the record in private_data) and not released, the record is wiped
 * from the dying copy: glibc keeps a freed block's bytes past its first
 * 16, and the scan at exit, which takes any copy of a record for a holder,
 * would find it there. A stream moved on before its holder was freed
 * keeps its record in the new copy, which is what the scan finds. */
#include "arrow_home.h"

#include <malloc.h>

#include "arrow_int.h"
#include "freefilter.h"
#include "spin.h"

#define NHOMES 64 /* streams called through a holder at once: more evict the oldest */

static struct {
    uintptr_t at;
    ar_rec *r;
    void *rel; /* its release there: capsan's trampoline */
} homes[NHOMES];
static unsigned next_slot;
static cs_spin mu = CS_SPIN_INIT;
_Atomic uint32_t cs_ar_nhomes;

/* the filter passes a block starting in at's granule or the one before (a
 * holder with a header of up to 256 bytes before the stream) */
static void mark(uintptr_t at, int sign)
{
    cs_ff_count(at >> CS_FF_GRAIN, sign);
    cs_ff_count((at >> CS_FF_GRAIN) - 1, sign);
}

static void drop(unsigned i)
{
    mark(homes[i].at, -1);
    homes[i].r->at = NULL;
    homes[i].at = 0;
    homes[i].r = NULL;
    atomic_fetch_sub_explicit(&cs_ar_nhomes, 1, memory_order_relaxed);
}

void cs_ar_home_note(void *rec, void *self)
{
    ar_rec *r = rec;
    if (r->at == self || self == r->home || r->kid)
        return; /* known, or still in its capsule (whose death is seen) */
    cs_spin_lock(&mu);
    for (unsigned i = 0; i < NHOMES; i++)
        if (homes[i].r == r) {
            drop(i); /* moved on: the old holder's copy is a moved-from one */
            break;
        }
    unsigned i = next_slot++ % NHOMES;
    if (homes[i].at)
        drop(i);
    homes[i].at = (uintptr_t)self;
    homes[i].r = r;
    homes[i].rel = FIELD(self, lay[r->type].rel);
    r->at = self;
    mark((uintptr_t)self, 1);
    atomic_fetch_add_explicit(&cs_ar_nhomes, 1, memory_order_relaxed);
    cs_spin_unlock(&mu);
}

void cs_ar_home_forget(void *rec)
{
    ar_rec *r = rec;
    if (!r->at)
        return;
    cs_spin_lock(&mu);
    for (unsigned i = 0; i < NHOMES; i++)
        if (homes[i].r == r) {
            drop(i);
            break;
        }
    cs_spin_unlock(&mu);
}

void cs_ar_home_freed(uintptr_t p)
{
    size_t span = 0;
    cs_spin_lock(&mu);
    for (unsigned i = 0; i < NHOMES; i++) {
        uintptr_t at = homes[i].at;
        if (!at || at < p || at - p > 4096)
            continue;
        if (!span)
            span = malloc_usable_size((void *)p);
        ar_rec *r = homes[i].r;
        const layout *L = &lay[r->type];
        if (at - p + L->size > span)
            continue; /* not inside this block */
        if (FIELD(at, L->pd) == r && FIELD(at, L->rel) == homes[i].rel)
            FIELD(at, L->pd) = NULL; /* the copy dies here: no stale record */
        drop(i);
    }
    cs_spin_unlock(&mu);
}
