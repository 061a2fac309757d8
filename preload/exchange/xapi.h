/* DLPack 1.3's C exchange API (rulebook-seams R50-R56): the
 * DLPackExchangeAPI table a type carries in its __dlpack_c_exchange_api__
 * capsule ("dlpack_exchange_api"), through which tvm-ffi and the kernel
 * libraries built on it take and return tensors with no DLPack capsule.
 *
 * Each table capsan sees is validated once (R50) and followed: its entries
 * are patched in place where its memory is writable (torch keeps it in
 * .bss), so consumers that cached the pointer earlier are seen too, and
 * a read-only table is answered with a shadow of capsan's whose entries
 * forward to it. Tensors born through the table join the DLPack lifecycle
 * with the trampoline deleter of deleter.h. */
#ifndef CAPSAN_XAPI_H
#define CAPSAN_XAPI_H

#include <stdint.h>

/* The table a capsule named "dlpack_exchange_api" holds: followed from
 * now on; returns what its reader should get (the table itself, patched,
 * or capsan's shadow). A table capsan cannot follow comes back as given.
 * `reading`: a consumer asked for it (validated then, once: R50). */
void *cs_xapi_table(void *table, int reading);
/* Undo the in-place patches (capsan.stop()): the tables are the
 * producers' own again. Shadows handed out keep forwarding. */
void cs_xapi_restore(void);
/* The original of entry `entry` (CS_XE_*) of a table capsan follows (its
 * own, or capsan's shadow); the entry as it stands otherwise. */
void *cs_xapi_original(const void *table, int entry);

#endif
