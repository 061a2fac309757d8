/* One reachability scan of the whole process (reach.c) with capsan's own
 * memory left out: its object table, its findings, the quarantine's
 * deferred blocks and its Arrow records, which hold every key. */
#ifndef CAPSAN_SCAN_H
#define CAPSAN_SCAN_H

#include <stddef.h>
#include <stdint.h>

#include "roots.h"

/* Scan for the sorted keys; cb once per key found. [also, also + also_n)
 * is capsan's too. -1 when out of memory (nothing scanned). */
int cs_scan_process(const uint64_t *keys, size_t n, const void *also, size_t also_n,
                    cs_root_cb cb, void *ud);

#endif
