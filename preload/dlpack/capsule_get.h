/* PyCapsule_GetPointer's hooks: any caller's, and the one numpy's own
 * module (_multiarray_umath) gets, which knows the NEP 49 handler's
 * capsule name by its address. */
#ifndef CAPSAN_CAPSULE_GET_H
#define CAPSAN_CAPSULE_GET_H

#include "pyapi.h"

void *cs_hook_GetPointer(PyObject_ *cap, const char *name);
void *cs_hook_np_GetPointer(PyObject_ *cap, const char *name);

#endif
