/* The free() filter's counts (see freefilter.h). */
#include "freefilter.h"

_Atomic uint16_t cs_ff_pages[1u << CS_FF_BITS];
_Atomic uint32_t cs_ff_watched;

void cs_ff_mark(uintptr_t p)
{
    cs_ff_count(p >> CS_FF_GRAIN, 1);
}
