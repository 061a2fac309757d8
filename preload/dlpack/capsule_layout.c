/* A capsule's layout, learned from the first capsule capsan makes
 * (capsule_int.h reads capsules with it). */
#include "capsule_int.h"

const void *cs_capsule_type;

void cs_capsule_learn_layout(PyObject_ *cap, void *ptr, const char *name, cs_capsule_dtor d)
{
    const capsule_obj *c = (const capsule_obj *)cap;
    if (!cs_capsule_type && c->pointer == ptr && c->name == name && c->destructor == d &&
        c->pointer == cs_py.Capsule_GetPointer(cap, name) && cs_py.Capsule_GetName(cap) == name)
        __atomic_store_n(&cs_capsule_type, c->type, __ATOMIC_RELEASE);
}
