/* What Python objects still reach: a walk of the object graph from a set
 * of roots, for the NumPy blocks an API scope (pytest) or a normal exit
 * (daemon threads, exitroots.c) counts as held rather than leaked. */
#ifndef CAPSAN_PYREACH_H
#define CAPSAN_PYREACH_H

#include <stddef.h>
#include <stdint.h>

#include "pyapi.h"

/* Walk from `roots` (any object: a list of roots is walked through) along
 * what each object's tp_traverse visits, an array's `base` and the tensor
 * of an unconsumed DLPack capsule. want[0..n) are block addresses, sorted;
 * found[i] is set to 1 when an array's data, or a capsule tensor's data,
 * is want[i]. Returns how many were found. GIL held; runs no Python code
 * (tp_traverse runs none). 0 when numpy is not imported. */
size_t cs_pyreach(PyObject_ *roots, const uint64_t *want, size_t n, uint8_t *found);

/* The same walk to its end, handing `collect` every object met whose
 * type's name starts with `prefix` (a new reference the callee owns). */
void cs_pyreach_collect(PyObject_ *roots, const char *prefix,
                        void (*collect)(PyObject_ *o, void *ud), void *ud);

/* numpy.ndarray (a static type), or NULL when numpy is not imported. GIL held. */
const void *cs_pyreach_ndarray(void);

#endif
