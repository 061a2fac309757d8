/* What the capsule*.c files share, private to them: a capsule read
 * directly once its layout is known (capsule_layout.c learns it), and
 * capsan's destructor stubs told apart from a producer's (capsule_dtor.c
 * defines them). Inline: the hooks and the stubs' bodies ask on every
 * DLPack capsule. */
#ifndef CAPSAN_CAPSULE_INT_H
#define CAPSAN_CAPSULE_INT_H

#include <stdint.h>

#include "pyapi.h"
#include "thread.h"

/* ---- reading a capsule ----
 * PyCapsule has kept one layout since 3.1 (PyObject_HEAD, pointer, name,
 * context, destructor). It is read directly once the first capsule capsan
 * makes has shown that layout; until then, and if it ever does not, the
 * C-API is asked (which costs calls and a strcmp per read). */
typedef struct capsule_obj {
    intptr_t refcnt;
    const void *type;
    void *pointer;
    const char *name;
    void *context;
    cs_capsule_dtor destructor;
} capsule_obj;

extern const void *cs_capsule_type; /* set once the layout is confirmed */

/* the layout confirmed on cap, just made by capsan as (ptr, name, d) */
void cs_capsule_learn_layout(PyObject_ *cap, void *ptr, const char *name, cs_capsule_dtor d);

/* cap's fields if it is a capsule of the known layout, else 0 */
static inline const capsule_obj *direct(PyObject_ *cap)
{
    const void *t = __atomic_load_n(&cs_capsule_type, __ATOMIC_ACQUIRE);
    const capsule_obj *c = (const capsule_obj *)cap;
    return t && c && c->type == t ? c : NULL;
}

static inline __attribute__((always_inline)) cs_capsule_dtor cap_destructor(PyObject_ *cap)
{
    const capsule_obj *c = direct(cap);
    return c ? c->destructor : cs_py.Capsule_GetDestructor(cap);
}

static inline __attribute__((always_inline)) const char *cap_name(PyObject_ *cap)
{
    const capsule_obj *c = direct(cap);
    return c ? c->name : cs_py.Capsule_GetName(cap);
}

static inline __attribute__((always_inline)) void *cap_pointer(PyObject_ *cap, const char *name)
{
    const capsule_obj *c = direct(cap);
    return c ? c->pointer : cs_py.Capsule_GetPointer(cap, name);
}

/* ---- destructor stubs: one per original destructor ----
 * An exported capsule gets stub k as its destructor, where dtors[k] is the
 * producer's own: the stub knows what to forward to without a table keyed
 * by capsule. Producers bring few distinct destructors (numpy's, torch's);
 * past NSTUBS a capsule keeps its own destructor and its death is not
 * seen. Each stub is 16 bytes: endbr64; mov $k, %esi; jmp to the shared
 * body, which gets (capsule, k). Arrow capsules get the 64 stubs that
 * follow, whose body is Arrow's (cs_ar_capsule_dtor_body): one range
 * check still tells a stub of capsan's, and the DLPack body knows nothing
 * of Arrow. */
#define NSTUBS 64
extern const char cs_dtor_stubs[] __attribute__((visibility("hidden")));

static inline cs_capsule_dtor stub(unsigned k)
{
    return (cs_capsule_dtor)(uintptr_t)(cs_dtor_stubs + 16 * k);
}

/* Arrow's stub k */
static inline cs_capsule_dtor ar_stub(unsigned k) { return stub(NSTUBS + k); }

/* k if d is stub k (DLPack's or Arrow's), else -1 */
static inline int stub_index(cs_capsule_dtor d)
{
    uintptr_t off = (uintptr_t)d - (uintptr_t)cs_dtor_stubs;
    return off < 2 * 16 * NSTUBS && !(off & 15) ? (int)(off / 16) % NSTUBS : -1;
}

static inline int is_ar_stub(cs_capsule_dtor d)
{
    return (uintptr_t)d - (uintptr_t)cs_dtor_stubs - 16 * NSTUBS < 16 * NSTUBS;
}

/* a producer's destructor of cap runs on this thread (capsule_dtor.c) */
static inline int in_dtor_of(const void *cap)
{
    cs_thread *t = cs_thread_get();
    return t && t->dtor_capsule == cap;
}

#endif
