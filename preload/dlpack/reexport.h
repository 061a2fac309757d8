/* dlpack-byte-offset-ignored by any consumer whose mistake shows: one that
 * re-exports memory it consumed, describing the same buffer but starting
 * at the consumed tensor's data field, byte_offset bytes before its first
 * element (a consumer with no offset of its own kept data as the start). */
#ifndef CAPSAN_REEXPORT_H
#define CAPSAN_REEXPORT_H

#include <stdatomic.h>
#include <stdint.h>

#include "freefilter.h"
#include "deleter.h"

void cs_dl_reexport_slow(const cs_loan *l, uint64_t start, uint32_t stack);
/* l was just exported (its EXPORT event has `stack`). The data watch
 * (freefilter.h) counts where consumed tensors' data fields point: an
 * export starting in no such granule costs two loads. */
static inline void cs_dl_reexport_check(const cs_loan *l, uint32_t stack)
{
    const char *t = (const char *)l->mt + (l->versioned ? CS_DLV_TENSOR_OFF : 0);
    uint64_t start = l->data + *(const uint64_t *)(t + CS_DL_BYTE_OFFSET_OFF);
    if (cs_ff_hit((uintptr_t)start))
        cs_dl_reexport_slow(l, start, stack);
}

#endif
