/* What Python objects still reach (see pyreach.h). The walk is the one
 * gc.get_referents makes, without a Python list per object: it reads the
 * type objects directly, whose fields after the object head are the same
 * from 3.8 on; the head is the build's (16 bytes longer free-threaded). */
#include "pyreach.h"

#include "arrow.h"
#include "capsan.h"
#include "heldmem.h"
#include "roots.h"
#include "runtime.h"
#include "young.h"

#include <stdlib.h>
#include <string.h>

#include "alloc.h"
#include "sort.h"

typedef int (*visitproc_)(PyObject_ *, void *);

/* PyTypeObject up to tp_is_gc (tp_vectorcall_offset took tp_print's
 * place in 3.8, at the same size), as it lies after a default build's
 * object head: type_of gives a free-threaded type's fields shifted so */
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
 * base after nd, dimensions and strides (+ head_extra free-threaded) */
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

/* how much longer than a default build's the object head is: 16 on a
 * free-threaded build (ob_tid, the shared refcount and its flags) */
static size_t head_extra;

/* o's type, seen through type_head's fields */
static inline const type_head *type_of(const PyObject_ *o)
{
    const char *tp = *(const char *const *)((const char *)o + 8 + head_extra);
    return (const type_head *)(tp + head_extra);
}

/* the type object itself (for comparisons and the C-API) */
static inline const void *type_obj(const type_head *t)
{
    return (const char *)t - head_extra;
}

static size_t slot_of(uintptr_t p, size_t cap)
{
    uint64_t h = (uint64_t)p * 0x9e3779b97f4a7c15ull;
    return (size_t)(h ^ (h >> 29)) & (cap - 1);
}

static int grow_seen(walk *w)
{
    size_t cap = w->capseen ? w->capseen * 2 : 1u << 14;
    uintptr_t *t = cs_calloc(cap, sizeof *t);
    if (!t)
        return 0;
    for (size_t i = 0; i < w->capseen; i++)
        if (w->seen[i]) {
            size_t j = slot_of(w->seen[i], cap);
            while (t[j])
                j = (j + 1) & (cap - 1);
            t[j] = w->seen[i];
        }
    cs_free(w->seen);
    w->seen = t;
    w->capseen = cap;
    return 1;
}

static int push(walk *w, PyObject_ *o)
{
    if (w->ntodo == w->captodo) {
        size_t cap = w->captodo ? w->captodo * 2 : 4096;
        PyObject_ **t = cs_realloc(w->todo, cap * sizeof *t);
        if (!t)
            return w->oom = 1, 0;
        w->todo = t;
        w->captodo = cap;
    }
    w->todo[w->ntodo++] = o;
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
    if (w->nseen >= MAX_OBJECTS || !push(w, o))
        return 0;
    w->seen[j] = (uintptr_t)o;
    w->nseen++;
    return 0;
}

/* What a type is to the walk (an ndarray, a library object that holds
 * memory unseen): a few types recur, each decided once */
typedef struct type_memo {
    const void *type[64];
    uint8_t what[64];
} type_memo;

static uint8_t memo_of(type_memo *m, const type_head *tp,
                       uint8_t (*decide)(const type_head *, const void *), const void *ctx)
{
    unsigned k = (unsigned)(((uintptr_t)tp >> 4) & 63);
    if (m->type[k] != tp) {
        m->type[k] = tp;
        m->what[k] = decide(tp, ctx);
    }
    return m->what[k];
}

static uint8_t array_type(const type_head *tp, const void *ndarray)
{
    return type_obj(tp) == ndarray || cs_py.Type_IsSubtype(type_obj(tp), ndarray);
}

/* The DLPack tensor a capsule holds (a producer's dltensor capsule, numpy's
 * owner capsule of an imported array), or 0; *data: an unconsumed one's
 * tensor data, else 0 */
static uint64_t capsule_tensor(PyObject_ *cap, uint64_t *data)
{
    const char *name = cs_py.Capsule_GetName(cap);
    *data = 0;
    int unconsumed = name && (!strcmp(name, "dltensor") || !strcmp(name, "dltensor_versioned"));
    if (!unconsumed && !(name && (!strcmp(name, "numpy_dltensor") ||
                                  !strcmp(name, "numpy_dltensor_versioned"))))
        return 0;
    const char *mt = cs_py.Capsule_GetPointer(cap, name);
    if (mt && unconsumed)
        *data = *(const uint64_t *)(mt + (strcmp(name, "dltensor") ? DLV_DATA : DL_DATA));
    return (uint64_t)(uintptr_t)mt;
}

/* the index of the block v, the first time it is found, or -1 */
static long mark(uint64_t v, const uint64_t *want, size_t n, uint8_t *found)
{
    long i = cs_key_index(want, n, v);
    if (i < 0 || found[i])
        return -1;
    found[i] = CS_REACH_OBJECT;
    return i;
}

const void *cs_pyreach_ndarray(void)
{
    /* numpy is imported already: capsan has blocks only then */
    PyObject_ *np = cs_py_module("numpy");
    PyObject_ *t = np ? cs_py.Object_GetAttrString(np, "ndarray") : NULL;
    if (!t) {
        cs_py.Err_Clear();
        return NULL;
    }
    cs_py.DecRef(t); /* a static type: numpy's module keeps it */
    return t;
}

/* the objects met that hold memory out of tp_traverse's sight (heldmem.c),
 * with the root they were reached from, for once the walk is done */
typedef struct held_obj {
    PyObject_ *o;
    uint32_t root;
    uint8_t lib;
} held_obj;

typedef struct held_list {
    cs_heldmem libs;
    held_obj *v;
    size_t n, cap;
    type_memo memo; /* what[]: the type's cs_held_lib */
} held_list;

#define MAX_HELD_OBJECTS 100000

static void keep_held(held_list *l, PyObject_ *o, uint32_t root, uint8_t lib)
{
    if (l->n == l->cap) {
        size_t cap = l->cap ? l->cap * 2 : 64;
        held_obj *v = l->n < MAX_HELD_OBJECTS ? cs_realloc(l->v, cap * sizeof *v) : NULL;
        if (!v)
            return;
        l->v = v, l->cap = cap;
    }
    cs_py.IncRef(o); /* past the walk: the libraries' getters run then */
    l->v[l->n++] = (held_obj){o, root, lib};
}

static uint8_t held_type(const type_head *tp, const void *libs)
{
    return (uint8_t)cs_heldmem_lib(libs, type_obj(tp), tp->tp_name);
}

static cs_held_lib held_lib(held_list *l, const type_head *tp)
{
    if (!l->libs.pyarrow && !l->libs.torch_tensor && !l->libs.ffi_object)
        return CS_HELD_NONE;
    return (cs_held_lib)memo_of(&l->memo, tp, held_type, &l->libs);
}

/* an address a held object gave: the wanted object whose memory it lies in */
typedef struct matcher {
    const uint64_t *lo, *hi, *who;
    const cs_heldmem *libs;
    const size_t *by_lo; /* indices, in lo order */
    size_t n;
    uint8_t *found;
    uint64_t *where;
    uint32_t *label;
    const held_obj *cur;
} matcher;

static const uint64_t *sort_lo;
static int cmp_by_lo(const void *a, const void *b)
{
    uint64_t x = sort_lo[*(const size_t *)a], y = sort_lo[*(const size_t *)b];
    return (x > y) - (x < y);
}

static void on_address(uint64_t a, void *ud)
{
    matcher *m = ud;
    size_t lo = 0, hi = m->n;
    while (lo < hi) { /* the first span starting above a */
        size_t mid = lo + (hi - lo) / 2;
        if (m->lo[m->by_lo[mid]] <= a)
            lo = mid + 1;
        else
            hi = mid;
    }
    /* the spans starting at or below a, nearest first (views overlap) */
    for (size_t j = lo, steps = 0; j > 0 && steps < 8; j--, steps++) {
        size_t k = m->by_lo[j - 1];
        if (a >= m->hi[k])
            continue;
        /* a tensor is held by its consumer's objects, not its producer's */
        if (m->who[k] && !cs_heldmem_consumed_by(m->libs, (cs_held_lib)m->cur->lib, m->who[k]))
            continue;
        if (m->cur->lib == CS_HELD_PYARROW) {
            /* pyarrow lets go of such a buffer at shutdown without releasing
             * its array: held whether or not the globals are cleared */
            m->found[k] = CS_REACH_ARROW;
            if (m->where)
                m->where[k] = a;
        } else if (!m->found[k]) {
            m->found[k] = CS_REACH_OBJECT;
            if (m->label)
                m->label[k] = m->cur->root;
        }
    }
}

static void match_held(held_list *l, const uint64_t *want, size_t n, uint8_t *found,
                       uint64_t *where, uint32_t *label)
{
    uint64_t *lo = l->n ? cs_calloc(n, sizeof *lo) : NULL, *hi = lo ? cs_calloc(n, sizeof *hi) : NULL;
    uint64_t *who = hi ? cs_calloc(n, sizeof *who) : NULL;
    size_t *by = who ? cs_malloc(n * sizeof *by) : NULL;
    if (by && cs_lc) {
        cs_young_flush(); /* the blocks still on their threads too */
        cs_lc_spans(cs_lc, want, n, lo, hi, who);
        for (size_t i = 0; i < n; i++)
            by[i] = i;
        sort_lo = lo; /* GIL held: one walk at a time */
        cs_sort(by, n, sizeof *by, cmp_by_lo);
        matcher m = {lo, hi, who, &l->libs, by, n, found, where, label, NULL};
        for (size_t i = 0; i < l->n; i++) {
            m.cur = &l->v[i];
            cs_heldmem_addresses(l->v[i].o, (cs_held_lib)l->v[i].lib, on_address, &m);
        }
    }
    cs_free(by), cs_free(who), cs_free(hi), cs_free(lo);
    for (size_t i = 0; i < l->n; i++)
        cs_py.DecRef(l->v[i].o);
    cs_free(l->v);
}

size_t cs_pyreach(PyObject_ *const *roots, size_t nroots, size_t nwalk, const uint64_t *want,
                  size_t n, uint8_t *found, uint64_t *where, uint32_t *label)
{
    if (!n || !cs_py.Type_IsSubtype || !cs_py.Capsule_Type || !cs_py.Err_Clear)
        return 0;
    if (!cs_py.ob_type_off) {
        /* an object head capsan cannot prove: no walk, and no one can
         * tell what is held; everything counts as reached, so that no
         * verdict built on this walk calls anything a leak */
        memset(found, CS_REACH_OBJECT, n);
        if (label)
            memset(label, 0, n * sizeof *label);
        return n;
    }
    head_extra = cs_py.ob_type_off - 8;
    /* no numpy imported: no blocks, but tensors and Arrow structs still */
    const void *ndarray = cs_pyreach_ndarray();
    memset(found, 0, n);
    walk w = {0};
    type_memo memo = {{0}, {0}};
    held_list held = {0};
    cs_heldmem_init(&held.libs);
    /* with objects that hold memory unseen, the walk goes on to its end
     * while something is still to be found; once everything is, only the
     * pyarrow buffers that `where` tells apart need the rest (a pytest
     * test's walk stops at its last block, whatever is imported) */
    int to_end = (held.libs.pyarrow || held.libs.torch_tensor || held.libs.ffi_object) && where;
    size_t got = 0;
    /* every root is seen from the start: one root's walk stops at another
     * (sys reaches every module through sys.modules, a function its
     * module's globals), so what each reaches is its own */
    for (size_t r = 0; r < nroots; r++)
        visit(roots[r], &w);
    w.ntodo = 0;
    for (size_t r = 0; r < nwalk && r < nroots && (to_end || got < n) && !w.oom; r++) {
        if (roots[r])
            push(&w, roots[r]);
        while (w.ntodo && (to_end || got < n) && !w.oom) {
            PyObject_ *o = w.todo[--w.ntodo];
            const type_head *tp = type_of(o);
            long k[2] = {-1, -1};
            cs_held_lib lib;
            if (ndarray && (type_obj(tp) == ndarray || memo_of(&memo, tp, array_type, ndarray))) {
                const char *a = (const char *)o + head_extra;
                k[0] = mark(*(const uint64_t *)(a + ND_DATA), want, n, found);
                visit(*(PyObject_ *const *)(a + ND_BASE), &w);
            } else if (type_obj(tp) == cs_py.Capsule_Type) {
                /* the tensor itself (an import's owner capsule, an export
                 * kept for later), and an unconsumed one's data */
                uint64_t data, mt = capsule_tensor(o, &data);
                /* or an Arrow struct's record: a capsule still referenced
                 * holds its struct, consumed or not */
                k[0] = mark(mt ? mt : cs_ar_capsule_key(o), want, n, found);
                k[1] = mark(data, want, n, found);
            } else if ((lib = held_lib(&held, tp)) != CS_HELD_NONE) {
                keep_held(&held, o, (uint32_t)r, (uint8_t)lib);
            }
            for (int j = 0; j < 2; j++)
                if (k[j] >= 0) {
                    got++;
                    if (label)
                        label[k[j]] = (uint32_t)r;
                }
            if ((tp->tp_flags & TPFLAGS_HAVE_GC) && tp->tp_traverse &&
                (!tp->tp_is_gc || tp->tp_is_gc(o)))
                tp->tp_traverse(o, visit, &w);
        }
    }
    cs_free(w.todo);
    cs_free(w.seen);
    match_held(&held, want, n, found, where, label);
    for (size_t i = got = 0; i < n; i++)
        got += found[i] != CS_REACH_NONE;
    return got;
}

int capsan_reached(PyObject_ *roots, const uint64_t *want, size_t n, uint8_t *found)
{
    return (int)cs_pyreach(&roots, roots ? 1 : 0, 1, want, n, found, NULL, NULL);
}
