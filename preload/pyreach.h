/* What Python objects still reach: a walk of the object graph from a set
 * of roots, for the NumPy blocks an API scope (pytest) or a normal exit
 * (daemon threads, exitroots.c) counts as held rather than leaked. */
#ifndef CAPSAN_PYREACH_H
#define CAPSAN_PYREACH_H

#include <stddef.h>
#include <stdint.h>

#include "pyapi.h"

/* How a block was reached */
enum { CS_REACH_NONE = 0, CS_REACH_OBJECT = 1, CS_REACH_ARROW = 2 };

/* Walk from `roots` (any object: a list of roots is walked through) along
 * what each object's tp_traverse visits, an array's `base` and the tensor
 * of an unconsumed DLPack capsule. want[0..n) are NumPy block addresses,
 * sorted. found[i] = CS_REACH_OBJECT when an array's data, or a capsule
 * tensor's data, is want[i]; when pyarrow is imported the walk goes to its
 * end, and then a buffer of a pyarrow object it met that lies in block i
 * sets found[i] = CS_REACH_ARROW (over CS_REACH_OBJECT) and where[i] (where
 * may be NULL) to the buffer's address (pabuffers.c). Returns how many were found. GIL held;
 * the walk runs no Python code (tp_traverse runs none), pyarrow's getters
 * run after it. 0 when numpy is not imported. */
size_t cs_pyreach(PyObject_ *roots, const uint64_t *want, size_t n, uint8_t *found,
                  uint64_t *where);

/* numpy.ndarray (a static type), or NULL when numpy is not imported. GIL held. */
const void *cs_pyreach_ndarray(void);

#endif
