/* A struct followed: the record goes into its private_data and capsan's
 * trampolines into its release (and a stream's get_schema, get_next,
 * get_last_error); a trampoline runs the producer's callback on a copy
 * with the producer's fields restored, and sees a second release, a
 * callback through a released stream, a struct moved (R42-R46). */
#ifndef CAPSAN_ARROW_WRAP_H
#define CAPSAN_ARROW_WRAP_H

#include "arrow_int.h"

/* Put the record and the trampolines into s (its release set). 0 when it
 * cannot be followed: unreadable or read-only, wrapped already (a
 * producer handing out a struct capsan wrapped), or malformed (*bad). */
int cs_ar_wrap(ar_rec *r, void *s, unsigned *bad, uint64_t *badval);
/* A struct found malformed (code: CS_ARK_*, value: what was wrong) or a
 * capsule misused: said about r (with stack 0, a stack of its own) */
void cs_ar_check_failed(ar_rec *r, PyObject_ *cap, unsigned code, uint64_t value, uint32_t stack);

/* Children (and dictionaries) of r, at any depth, its owner has moved
 * out so far: each an object of its own from here, born at this stack
 * (the parent's release sees the rest). Called where the owner of a
 * parent moved out of its capsule is still at work: the capsule's death. */
void cs_ar_moves_seen(ar_rec *r);

/* f is capsan's release trampoline for structs of that cs_ar_type */
int cs_ar_is_tramp(const void *f, int type);

#endif
