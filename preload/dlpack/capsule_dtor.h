/* A capsule dying: every capsule capsan follows has one of its destructor
 * stubs as its destructor (capsule_int.h), whose body runs the producer's
 * destructor and tells the lifecycle; and R4, a destructor that reports
 * the capsule it destroys. */
#ifndef CAPSAN_CAPSULE_DTOR_H
#define CAPSAN_CAPSULE_DTOR_H

#include "pyapi.h"

/* The stub that forwards to d (NULL included); -1 when all are taken. */
int cs_capsule_stub_for(cs_capsule_dtor d);
/* the producer's destructor behind one of ours, or d itself */
cs_capsule_dtor cs_capsule_unwrap(cs_capsule_dtor d);

/* The capsule whose running destructor read its pointer under the
 * unconsumed name (set by PyCapsule_GetPointer's hook, capsule_get.c) */
extern __thread const void *cs_dtor_took __attribute__((tls_model("initial-exec")));

/* PyErr_WriteUnraisable's hook (R4) */
void cs_hook_WriteUnraisable(PyObject_ *obj);

#endif
