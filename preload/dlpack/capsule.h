/* PyCapsule hooks and the DLPack trampolines. The capsule destructor and
 * the DLManagedTensor deleter are function pointers no symbol hook can
 * see, so at export both are swapped for capsan's wrappers; the originals
 * are kept (capsule table here, the export event in the lifecycle). */
#ifndef CAPSAN_CAPSULE_H
#define CAPSAN_CAPSULE_H

#include "got.h"

/* The PyCapsule_* entries of the hook table. */
extern const cs_hook cs_capsule_hooks[];
extern const int cs_capsule_nhooks;

#endif
