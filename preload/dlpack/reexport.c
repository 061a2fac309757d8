/* dlpack-byte-offset-ignored on a re-export (see reexport.h).
 *
 * A consumed tensor T with byte_offset k > 0 has its first element at
 * T.data + k. A new export E whose first element is at T.data itself, of
 * T's byte size, with another owner's deleter (T's producer lending two
 * views of one buffer uses its own), is T's memory handed on by its
 * consumer from the wrong start: whoever reads E gets k bytes of what
 * lies before T's elements and loses T's last k bytes. */
#include "reexport.h"

#include "dataindex.h"
#include "lifecycle.h"
#include "runtime.h"
#include "young.h"

void cs_dl_reexport_slow(const cs_loan *l, uint64_t start, uint32_t stack)
{
    if (!cs_recording || !cs_lc)
        return;
    uint64_t hit[8];
    size_t n = cs_di_starts_in(start, start + 1, hit, 8);
    for (size_t i = 0; i < n; i++) {
        if (hit[i] == (uint64_t)(uintptr_t)l->mt)
            continue;
        /* a tensor its thread's table still holds is read there: moving
         * it to the lifecycle for a look would cost its delete the fast
         * path (a round trip back re-exports on every iteration) */
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
        if (!live || origin.kind != CS_EV_EXPORT || origin.c != l->nbytes ||
            origin.b == (uint64_t)(uintptr_t)l->deleter)
            continue;
        /* consumed and not released: its consumer still holds it */
        uint64_t off, data;
        if (!cs_dl_view((void *)(uintptr_t)hit[i], (origin.aux & CS_DLV_VERSIONED) != 0, &off,
                        &data) ||
            !off || data != start)
            continue;
        cs_young_dl_adopt(hit[i]); /* the finding is the lifecycle's */
        cs_event ev = {.kind = CS_EV_REEXPORT, .obj = hit[i], .a = (uint64_t)(uintptr_t)l->mt,
                       .b = start, .c = off, .stack = stack};
        cs_emit(&ev, 0, NULL, NULL);
    }
}
