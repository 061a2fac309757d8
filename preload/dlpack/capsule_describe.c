/* For capsan.describe() (capsan.h): what capsan's wrappers of a capsule
 * and of a tensor stand in for, and a capsule's pointer read without
 * being taken for a consumer's read. */
#include <stdint.h>

#include "capsan.h"
#include "capsule_dtor.h"
#include "pyapi.h"
#include "runtime.h"
#include "young.h"

void *capsan_original_destructor(PyObject_ *cap)
{
    return cap ? (void *)(uintptr_t)cs_capsule_unwrap(cs_py.Capsule_GetDestructor(cap)) : NULL;
}

void *capsan_original_deleter(void *mt)
{
    cs_event origin;
    int found;
    if (!mt || !cs_lc)
        return NULL;
    cs_young_dl_adopt((uint64_t)(uintptr_t)mt);
    cs_lc_lock(cs_lc, (uint64_t)(uintptr_t)mt);
    found = cs_lc_origin(cs_lc, CS_NS_DLPACK, (uint64_t)(uintptr_t)mt, &origin);
    cs_lc_unlock(cs_lc, (uint64_t)(uintptr_t)mt);
    return found && origin.kind == CS_EV_EXPORT ? (void *)(uintptr_t)origin.b : NULL;
}

/* Read a capsule's pointer with its current name and record nothing: an
 * inspection (capsan.describe) is not a consumer. */
void *capsan_capsule_peek(PyObject_ *cap)
{
    const char *name = cap ? cs_py.Capsule_GetName(cap) : NULL;
    return cap ? cs_py.Capsule_GetPointer(cap, name) : NULL;
}
