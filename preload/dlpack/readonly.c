/* dlpack-read-only-dropped on a re-export (see readonly.h).
 *
 * A consumed, still-held versioned tensor T with READ_ONLY set, and a new
 * export E without it whose first element is T's, of T's byte size, with
 * another owner's deleter (T's producer lending a writable view of its
 * own buffer uses its own deleter, and that is its business): E is T's
 * memory handed on by its consumer, the promise not to write lost. */
#include "readonly.h"

#include "dataindex.h"
#include "lifecycle.h"
#include "runtime.h"
#include "young.h"

_Atomic int cs_dl_ro_seen;

void cs_dl_ro_slow(const cs_loan *l, uint32_t stack)
{
    if (!cs_recording || !cs_lc)
        return;
    uint64_t off, data;
    if (!cs_dl_view(l->mt, l->versioned, &off, &data))
        return;
    uint64_t first = data + off;
    uint64_t hit[8];
    size_t n = cs_di_starts_in(l->data, l->data + 1, hit, 8);
    for (size_t i = 0; i < n; i++) {
        if (hit[i] == (uint64_t)(uintptr_t)l->mt)
            continue;
        /* as in reexport.c: a young tensor is read in its thread's table */
        cs_event origin;
        int live, consumed;
        if (cs_young_dl_peek(hit[i], &origin, &consumed)) {
            live = consumed;
        } else {
            cs_lc_lock(cs_lc, hit[i]);
            live = cs_lc_origin(cs_lc, CS_NS_DLPACK, hit[i], &origin) &&
                   cs_lc_state(cs_lc, CS_NS_DLPACK, hit[i]) == CS_ST_CONSUMED;
            cs_lc_unlock(cs_lc, hit[i]);
        }
        if (!live || origin.kind != CS_EV_EXPORT || !(origin.aux & CS_DLV_VERSIONED) ||
            origin.c != l->nbytes || origin.b == (uint64_t)(uintptr_t)l->deleter)
            continue;
        /* consumed and not released: its consumer holds it, so it is readable */
        const void *t = (const void *)(uintptr_t)hit[i];
        uint64_t toff, tdata;
        if (!cs_dl_ro_flag(t, 1) || !cs_dl_view(t, 1, &toff, &tdata) || tdata + toff != first)
            continue;
        cs_young_dl_adopt(hit[i]); /* the finding is the lifecycle's */
        cs_event ev = {.kind = CS_EV_REEXPORT, .obj = hit[i], .a = (uint64_t)(uintptr_t)l->mt,
                       .b = first, .c = 0, .stack = stack,
                       .aux = l->versioned ? CS_REEXPORT_RO_VERSIONED : CS_REEXPORT_RO_LEGACY};
        cs_emit(&ev, 0, NULL, NULL);
    }
}
