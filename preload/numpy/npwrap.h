/* Where foreign memory was wrapped: arrays that extensions make around
 * memory numpy did not allocate (PyArray_New / PyArray_NewFromDescr with
 * data != NULL). When numpy later free()s such memory (an OWNDATA misuse),
 * the report names the line that made the array. */
#ifndef CAPSAN_NPWRAP_H
#define CAPSAN_NPWRAP_H

#include <stdint.h>
#include "tracefmt.h"

/* Replace the constructors in numpy's C-API table `api` (numpy's own
 * writable PyArray_API, which every extension calls through; numpy's
 * internal calls do not). Once per process; later calls do nothing. */
void cs_npwrap_install(void **api);
/* The wrap whose memory holds p (its exact start first, then the wrapped
 * span that contains p): fills `out` as a CS_EV_NP_WRAP event about p and
 * returns 1, or returns 0. Remembered wraps are a bounded, lossy cache. */
int cs_npwrap_find(uintptr_t p, cs_event *out);

#endif
