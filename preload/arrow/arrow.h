/* The Arrow PyCapsule interface (rulebook-seams R40-R48): arrow_* capsules
 * and the C Data / C Stream structs they carry.
 *
 * A struct is followed through a record of capsan's that is born with its
 * capsule (PyCapsule_New: the struct may still be empty there) and wrapped
 * into the struct at its consumer's first PyCapsule_GetPointer, or at its
 * capsule's destructor if nobody asked: the record goes into private_data
 * and capsan's trampolines into release (and a stream's get_schema,
 * get_next, get_last_error). A move is a bitwise copy, so every copy
 * carries the record; each trampoline calls the producer's callback on a
 * copy of the struct with the producer's own fields restored. With
 * arrow_wrap=0 no struct is ever written: only capsules are judged.
 * The capsule hooks (capsule*.c) call these for capsules whose name is an
 * Arrow one; the records are arrow_rec.c's, the wrapping arrow_wrap.c's. */
#ifndef CAPSAN_ARROW_H
#define CAPSAN_ARROW_H

#include <stddef.h>
#include <stdint.h>

typedef struct _object PyObject_;

/* A capsule made (type: cs_ar_type); has_dtor: it has a destructor. */
/* maker: the return address of the PyCapsule_New call, site: of the
 * PyCapsule_GetPointer call (a library reading its own capsule) */
void cs_ar_new(PyObject_ *cap, void *ptr, int type, int has_dtor, uint8_t gil_flags,
               const void *maker);
/* A consumer's read of the capsule (not its own destructor's). */
void cs_ar_read(PyObject_ *cap, void *ptr, const void *site);
/* The capsule's destructor is about to run (has_dtor: it has one), and
 * has returned: `state` carries what was seen before it ran. */
typedef struct cs_ar_dying {
    void *rec;
    int set;           /* release was set at entry */
    int released;      /* released before */
    int has_dtor;
} cs_ar_dying;
void cs_ar_dtor_enter(PyObject_ *cap, void *ptr, int has_dtor, cs_ar_dying *d);
void cs_ar_dtor_exit(PyObject_ *cap, cs_ar_dying *d);
/* PyCapsule_SetName on an Arrow capsule (R40). */
void cs_ar_renamed(PyObject_ *cap);
/* PyCapsule_New made cap under a near miss of an Arrow name (R40; names.h
 * said so), called from ret: a warning once per name and call site. */
void cs_ar_bad_name(PyObject_ *cap, const char *name, void *ret, uint8_t gil_flags);

/* The record of a live Arrow capsule as its events name it (obj), 0 if
 * capsan does not follow it or its struct was moved out (the capsule holds
 * it no more): for the exit's walk of what Python reaches (pyreach.c).
 * GIL held. */
uint64_t cs_ar_capsule_key(const PyObject_ *cap);

/* capsan's own memory that holds records (for a reachability scan;
 * arrow_rec.c) */
void cs_ar_own_memory(void (*fn)(void *ud, const void *p, size_t n), void *ud);

#endif
