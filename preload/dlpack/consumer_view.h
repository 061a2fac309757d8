/* R17 for a consumer written in Python: where the array it made of a
 * consumed tensor starts (see consumer_view.c). */
#ifndef CAPSAN_CONSUMER_VIEW_H
#define CAPSAN_CONSUMER_VIEW_H

#include <stdint.h>

enum { CS_VIEW_UNKNOWN = 0, CS_VIEW_IGNORED = 1, CS_VIEW_HONORED = 2 };

/* A consume whose rename was called from ret, of a tensor whose first
 * element is at data + off (off != 0): CS_VIEW_IGNORED when the consumer's
 * own array starts at data, CS_VIEW_HONORED at data + off, else
 * CS_VIEW_UNKNOWN. GIL held. */
int cs_consumer_view(const void *ret, uint64_t data, uint64_t off);

#endif
