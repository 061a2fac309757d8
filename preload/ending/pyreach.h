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

/* Walk from each of the first nwalk of the nroots roots in turn (any
 * objects: a list of roots is walked through; one root's walk stops at the
 * others, and the rest are only stops) along what each
 * object's tp_traverse visits, an array's `base` and the tensor of a
 * DLPack capsule. want[0..n) are NumPy block addresses, DLPack tensor
 * (struct) addresses and Arrow records (arrow.h), sorted. found[i] =
 * CS_REACH_OBJECT when an array's data, a capsule's tensor, an unconsumed
 * capsule tensor's data or an Arrow capsule's record is
 * want[i], and label[i] (label may be NULL) = the root it was first
 * reached from. The walk stops once every want[i] is found; with
 * pyarrow, torch or tvm-ffi imported it goes on while some are not (and,
 * with `where`, to its end), and then asks the library objects it met
 * for the memory they hold (heldmem.c): a torch or tvm-ffi tensor's data
 * in a block or a consumed tensor's data counts as CS_REACH_OBJECT from
 * the object's root; a pyarrow buffer in a block sets CS_REACH_ARROW
 * (over CS_REACH_OBJECT) and where[i] (where may be NULL) to the buffer's
 * address. Returns how many were
 * found. GIL held; the walk runs no Python code (tp_traverse runs none),
 * the libraries' getters run after it. Without numpy imported, arrays
 * are not looked at (there are no blocks). */
size_t cs_pyreach(PyObject_ *const *roots, size_t nroots, size_t nwalk, const uint64_t *want,
                  size_t n, uint8_t *found, uint64_t *where, uint32_t *label);

/* numpy.ndarray (a static type), or NULL when numpy is not imported. GIL held. */
const void *cs_pyreach_ndarray(void);

#endif
