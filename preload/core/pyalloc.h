/* The Python allocator's entry points, as a deleter that runs without the
 * GIL calls them (R12): PyMem_Malloc/Calloc/Realloc and PyObject_Malloc/
 * Calloc/Realloc/Free need the GIL, and a deleter that uses them from a
 * thread without it corrupts the allocator's pools (PYTHONMALLOC=debug
 * aborts). A macro such as Py_XDECREF makes no call; these are calls, so
 * their GOT slots tell. PyMem_Free is dataguard.c's (it also frees data). */
#ifndef CAPSAN_PYALLOC_H
#define CAPSAN_PYALLOC_H

#include "got.h"

/* The originals were found: cs_pyalloc_hooks may be installed. */
int cs_pyalloc_ready(void);
extern const cs_hook cs_pyalloc_hooks[];
extern const int cs_pyalloc_nhooks;

#endif
