/* What Python objects still reach (see pyreach.h). The walk is the one
 * gc.get_referents makes, without a Python list per object: it reads the
 * type objects directly, whose head is the same from 3.8 to 3.13. */
#include "pyreach.h"

#include "capsan.h"
#include "pabuffers.h"
#include "roots.h"
#include "runtime.h"

#include <stdlib.h>
#include <string.h>

typedef int (*visitproc_)(PyObject_ *, void *);

/* PyTypeObject up to tp_is_gc (tp_vectorcall_offset took tp_print's
 * place in 3.8, at the same size) */
typedef struct type_head {
    intptr_t ob_refcnt;
    const void *ob_type;
    intptr_t ob_size;
    const char *tp_name;
    intptr_t tp_basicsize, tp_itemsize;
    void *tp_dealloc;
    intptr_t tp_vectorcall_offset;
    void *tp_getattr, *tp_setattr, *tp_as_async, *tp_repr, *tp_as_number, *tp_as_sequence,
        *tp_as_mapping, *tp_hash, *tp_call, *tp_str, *tp_getattro, *tp_setattro, *tp_as_buffer;
    unsigned long tp_flags;
    const char *tp_doc;
    int (*tp_traverse)(PyObject_ *, visitproc_, void *);
    void *tp_clear, *tp_richcompare;
    intptr_t tp_weaklistoffset;
    void *tp_iter, *tp_iternext, *tp_methods, *tp_members, *tp_getset, *tp_base, *tp_dict,
        *tp_descr_get, *tp_descr_set;
    intptr_t tp_dictoffset;
    void *tp_init, *tp_alloc, *tp_new, *tp_free;
    int (*tp_is_gc)(PyObject_ *);
} type_head;

#define TPFLAGS_HAVE_GC (1UL << 14)
/* PyArrayObject_fields (numpy 1.x and 2.x): data after the object head,
 * base after nd, dimensions and strides */
#define ND_DATA 16
#define ND_BASE 48
/* dl_tensor.data in DLManagedTensor, and after version, manager_ctx,
 * deleter and flags in DLManagedTensorVersioned */
#define DL_DATA 0
#define DLV_DATA 32
/* the walk's bound: a heap this size is walked in about a second */
#define MAX_OBJECTS (16u << 20)

typedef struct walk {
    PyObject_ **todo;
    size_t ntodo, captodo;
    uintptr_t *seen; /* open addressing; 0 = empty */
    size_t nseen, capseen;
    int oom;
} walk;

static inline const type_head *type_of(const PyObject_ *o)
{
    return *(const type_head *const *)((const char *)o + sizeof(intptr_t));
}

static size_t slot_of(uintptr_t p, size_t cap)
{
    uint64_t h = (uint64_t)p * 0x9e3779b97f4a7c15ull;
    return (size_t)(h ^ (h >> 29)) & (cap - 1);
}

static int grow_seen(walk *w)
{
    size_t cap = w->capseen ? w->capseen * 2 : 1u << 14;
    uintptr_t *t = calloc(cap, sizeof *t);
    if (!t)
        return 0;
    for (size_t i = 0; i < w->capseen; i++)
        if (w->seen[i]) {
            size_t j = slot_of(w->seen[i], cap);
            while (t[j])
                j = (j + 1) & (cap - 1);
            t[j] = w->seen[i];
        }
    free(w->seen);
    w->seen = t;
    w->capseen = cap;
    return 1;
}

/* o, the first time it is met: onto the list to look at */
static int visit(PyObject_ *o, void *arg)
{
    walk *w = arg;
    if (!o || w->oom)
        return 0;
    if ((w->nseen + 1) * 2 > w->capseen && !grow_seen(w))
        return w->oom = 1, 0;
    size_t j = slot_of((uintptr_t)o, w->capseen);
    for (; w->seen[j]; j = (j + 1) & (w->capseen - 1))
        if (w->seen[j] == (uintptr_t)o)
            return 0;
    if (w->nseen >= MAX_OBJECTS)
        return 0;
    if (w->ntodo == w->captodo) {
        size_t cap = w->captodo ? w->captodo * 2 : 4096;
        PyObject_ **t = realloc(w->todo, cap * sizeof *t);
        if (!t)
            return w->oom = 1, 0;
        w->todo = t;
        w->captodo = cap;
    }
    w->seen[j] = (uintptr_t)o;
    w->nseen++;
    w->todo[w->ntodo++] = o;
    return 0;
}

/* ndarray or a subclass: a few types recur, each decided once */
typedef struct type_memo {
    const void *type[64];
    uint8_t is[64];
} type_memo;

static int is_array(type_memo *m, const type_head *tp, const void *ndarray)
{
    if (tp == ndarray)
        return 1;
    unsigned k = (unsigned)(((uintptr_t)tp >> 4) & 63);
    if (m->type[k] != tp) {
        m->type[k] = tp;
        m->is[k] = (uint8_t)(cs_py.Type_IsSubtype(tp, ndarray) != 0);
    }
    return m->is[k];
}

/* The tensor data of an unconsumed DLPack capsule, or 0 */
static uint64_t capsule_data(PyObject_ *cap)
{
    const char *name = cs_py.Capsule_GetName(cap);
    size_t off;
    if (name && !strcmp(name, "dltensor"))
        off = DL_DATA;
    else if (name && !strcmp(name, "dltensor_versioned"))
        off = DLV_DATA;
    else
        return 0;
    const char *mt = cs_py.Capsule_GetPointer(cap, name);
    return mt ? *(const uint64_t *)(mt + off) : 0;
}

static size_t mark(uint64_t v, const uint64_t *want, size_t n, uint8_t *found)
{
    long i = cs_key_index(want, n, v);
    if (i < 0 || found[i])
        return 0;
    return found[i] = CS_REACH_OBJECT;
}

const void *cs_pyreach_ndarray(void)
{
    /* numpy is imported already: capsan has blocks only then */
    PyObject_ *np = cs_py.Import_ImportModule ? cs_py.Import_ImportModule("numpy") : NULL;
    PyObject_ *t = np ? cs_py.Object_GetAttrString(np, "ndarray") : NULL;
    if (np)
        cs_py.DecRef(np);
    if (!t) {
        cs_py.Err_Clear();
        return NULL;
    }
    cs_py.DecRef(t); /* a static type: numpy's module keeps it */
    return t;
}

/* the pyarrow objects met, for their buffers once the walk is done */
typedef struct pa_list {
    PyObject_ **v;
    size_t n, cap;
    type_memo memo; /* is[]: a pyarrow type */
} pa_list;

#define MAX_PA_OBJECTS 100000

static void keep_pa(pa_list *l, PyObject_ *o)
{
    if (l->n == l->cap) {
        size_t cap = l->cap ? l->cap * 2 : 64;
        PyObject_ **v = l->n < MAX_PA_OBJECTS ? realloc(l->v, cap * sizeof *v) : NULL;
        if (!v)
            return;
        l->v = v, l->cap = cap;
    }
    cs_py.IncRef(o); /* past the walk: pyarrow's getters run then */
    l->v[l->n++] = o;
}

static int pa_type(pa_list *l, const type_head *tp)
{
    unsigned k = (unsigned)(((uintptr_t)tp >> 4) & 63);
    if (l->memo.type[k] != tp) {
        l->memo.type[k] = tp;
        l->memo.is[k] = (uint8_t)cs_pa_type(tp->tp_name);
    }
    return l->memo.is[k];
}

/* The buffers of the pyarrow objects met, for the blocks not found yet */
static void pa_found(pa_list *l, const uint64_t *want, size_t n, uint8_t *found, uint64_t *where)
{
    uint64_t *sizes = l->n ? calloc(n, sizeof *sizes) : NULL;
    if (sizes && cs_lc && cs_lc_sizes(cs_lc, CS_NS_NUMPY, want, n, sizes))
        cs_pa_buffers(l->v, l->n, want, sizes, n, found, CS_REACH_ARROW, where);
    free(sizes);
    for (size_t i = 0; i < l->n; i++)
        cs_py.DecRef(l->v[i]);
    free(l->v);
}

size_t cs_pyreach(PyObject_ *roots, const uint64_t *want, size_t n, uint8_t *found,
                  uint64_t *where)
{
    if (!n || !roots || !cs_py.Type_IsSubtype || !cs_py.Capsule_Type || !cs_py.Err_Clear)
        return 0;
    const void *ndarray = cs_pyreach_ndarray();
    if (!ndarray)
        return 0;
    memset(found, 0, n);
    walk w = {0};
    type_memo memo = {{0}, {0}};
    pa_list pa = {0};
    int arrow = cs_pa_imported(); /* then the walk goes on to its end */
    size_t got = 0;
    visit(roots, &w);
    while (w.ntodo && (arrow || got < n) && !w.oom) {
        PyObject_ *o = w.todo[--w.ntodo];
        const type_head *tp = type_of(o);
        if (is_array(&memo, tp, ndarray)) {
            got += mark(*(const uint64_t *)((const char *)o + ND_DATA), want, n, found);
            visit(*(PyObject_ *const *)((const char *)o + ND_BASE), &w);
        } else if ((const void *)tp == cs_py.Capsule_Type) {
            got += mark(capsule_data(o), want, n, found);
        } else if (arrow && pa_type(&pa, tp)) {
            keep_pa(&pa, o);
        }
        if ((tp->tp_flags & TPFLAGS_HAVE_GC) && tp->tp_traverse && (!tp->tp_is_gc || tp->tp_is_gc(o)))
            tp->tp_traverse(o, visit, &w);
    }
    free(w.todo);
    free(w.seen);
    pa_found(&pa, want, n, found, where);
    for (size_t i = got = 0; i < n; i++)
        got += found[i] != CS_REACH_NONE;
    return got;
}

int capsan_reached(PyObject_ *roots, const uint64_t *want, size_t n, uint8_t *found)
{
    return (int)cs_pyreach(roots, want, n, found, NULL);
}
