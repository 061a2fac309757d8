/* Capsan's records of exported Arrow structs (arrow_int.h): one per
 * struct, its identity through moves, made with its capsule and found
 * again from it. A record is never freed (stale copies of its struct may
 * still point to it): a released one is reused only after 8192 later ones. */
#ifndef CAPSAN_ARROW_REC_H
#define CAPSAN_ARROW_REC_H

#include "arrow_int.h"

/* a new record of that cs_ar_type, zeroed (NULL: no memory) */
ar_rec *cs_ar_rec_alloc(int type);
/* DONE_* bits set: a record with all of them is retired */
void cs_ar_rec_done(ar_rec *r, unsigned bits);

/* the live capsule cap holds r */
void cs_ar_ctab_put(PyObject_ *cap, ar_rec *r);
/* the record of cap, taken out of the table when take */
ar_rec *cs_ar_ctab_get(const PyObject_ *cap, int take);

#endif
