/* Arrow C Data structs handed over by address (R49): libarrow's export
 * and import functions (arrow::ExportArray, ImportRecordBatchReader...),
 * which pyarrow's _export_to_c / _import_from_c call and any library
 * linking libarrow may call, hooked in the GOT of every object that
 * imports them. An export fills a struct its caller owns: a birth. An
 * import moves a struct into the importer, which releases it from then
 * on; a struct first met there was born in a library capsan never saw
 * export it. Both follow the struct with the capsule path's records and
 * trampolines (arrow_rec.c, arrow_wrap.c): one model. */
#ifndef CAPSAN_ARROW_BYADDR_H
#define CAPSAN_ARROW_BYADDR_H

#include <stddef.h>

#include "got.h"

extern const cs_hook cs_ar_addr_hooks[];
extern const int cs_ar_addr_nhooks;

/* The structs of the last Arrow capsules made or read on this thread:
 * pyarrow makes a capsule around an empty struct, then exports into it
 * (and imports a capsule's struct it just read). Those calls are the
 * capsule path's, not hand-overs by address. Two: a schema and an array. */
extern __thread const void *cs_ar_cap_structs[2] __attribute__((tls_model("initial-exec")));
extern __thread unsigned cs_ar_cap_next __attribute__((tls_model("initial-exec")));

static inline void cs_ar_note_capsule_struct(const void *s)
{
    cs_ar_cap_structs[cs_ar_cap_next++ & 1] = s;
}

static inline void cs_ar_forget_capsule_struct(const void *s)
{
    if (cs_ar_cap_structs[0] == s)
        cs_ar_cap_structs[0] = NULL;
    if (cs_ar_cap_structs[1] == s)
        cs_ar_cap_structs[1] = NULL;
}

#endif
