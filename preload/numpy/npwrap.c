/* Where foreign memory was wrapped (npwrap.h).
 *
 * Extensions make arrays around memory of their own through numpy's C-API
 * table. Replacing two of its entries sees each such call, from every
 * extension, at the cost of one stack capture (Python frames) per wrap.
 * The wraps go into a small direct-mapped cache keyed by the data pointer:
 * a newer wrap evicts an older one in its slot, so memory stays fixed
 * however many arrays a program makes. A wrap is never a finding by itself;
 * free_hooks.c looks one up only when numpy free()s memory no handler gave. */
#include "npwrap.h"

#include <stdatomic.h>
#include <stdio.h>
#include <unistd.h>

#include "options.h"
#include "probe.h"
#include "pyapi.h"
#include "runtime.h"
#include "stack.h"

/* numpy's C-API table indices (stable since numpy 1.0) */
#define API_NEW 93            /* PyArray_New */
#define API_NEW_FROM_DESCR 94 /* PyArray_NewFromDescr */

typedef PyObject_ *(*new_fn)(void *, int, const intptr_t *, int, const intptr_t *, void *, int,
                             int, PyObject_ *);
typedef PyObject_ *(*new_descr_fn)(void *, void *, int, const intptr_t *, const intptr_t *, void *,
                                   int, PyObject_ *);
static new_fn orig_new;
static new_descr_fn orig_new_descr;

/* One remembered wrap. seq is odd while a writer fills the slot. */
typedef struct wrap {
    _Atomic uint32_t seq;
    uint32_t stack;
    uint64_t data, lo, hi, time_ns; /* [lo, hi): the bytes the array spans */
} wrap;

#define NWRAPS 4096
static wrap wraps[NWRAPS];

static unsigned slot_of(uintptr_t data)
{
    return (unsigned)(((uint64_t)(data >> 4) * 0x9e3779b97f4a7c15ull) >> 52);
}

/* The bytes an array's elements span, from its own fields (PyArrayObject:
 * data, nd, dimensions, strides after the object header; the same in
 * numpy 1.x and 2.x). The element size is taken as the smallest nonzero
 * stride: exact for contiguous arrays, and a wrap only needs to contain
 * the pointers a free can be given. */
static int span_of(PyObject_ *arr, uintptr_t *data, uintptr_t *lo, uintptr_t *hi)
{
    const char *a = (const char *)arr;
    if (!cs_probe_read(a + 16, 32))
        return 0;
    uintptr_t d = *(const uintptr_t *)(a + 16);
    int nd = *(const int *)(a + 24);
    const intptr_t *dims = *(const intptr_t *const *)(a + 32);
    const intptr_t *strides = *(const intptr_t *const *)(a + 40);
    if (nd < 0 || nd > 64 ||
        (nd && (!cs_probe_read(dims, (size_t)nd * 8) || !cs_probe_read(strides, (size_t)nd * 8))))
        return 0;
    uintptr_t l = d, h = d;
    intptr_t item = 0;
    for (int i = 0; i < nd; i++) {
        if (dims[i] <= 0) { /* no elements: only the pointer itself */
            l = h = d;
            item = 1;
            break;
        }
        intptr_t s = strides[i], ext = (dims[i] - 1) * s;
        if (ext > 0)
            h += (uintptr_t)ext;
        else
            l -= (uintptr_t)-ext;
        intptr_t as = s < 0 ? -s : s;
        if (as && (!item || as < item))
            item = as;
    }
    *data = d;
    *lo = l;
    *hi = h + (uintptr_t)(item ? item : 1);
    return 1;
}

static void remember(PyObject_ *arr)
{
    uintptr_t data, lo, hi;
    if (!span_of(arr, &data, &lo, &hi))
        return;
    uint32_t stack = cs_stack_now(CS_STACK_PYTHON, CS_EV_NP_WRAP);
    wrap *w = &wraps[slot_of(data)];
    uint32_t s = atomic_load_explicit(&w->seq, memory_order_relaxed);
    /* a slot another thread is filling right now: this wrap is dropped */
    if ((s & 1) || !atomic_compare_exchange_strong_explicit(&w->seq, &s, s + 1,
                                                            memory_order_acquire,
                                                            memory_order_relaxed))
        return;
    __atomic_store_n(&w->data, data, __ATOMIC_RELAXED);
    __atomic_store_n(&w->lo, lo, __ATOMIC_RELAXED);
    __atomic_store_n(&w->hi, hi, __ATOMIC_RELAXED);
    __atomic_store_n(&w->stack, stack, __ATOMIC_RELAXED);
    __atomic_store_n(&w->time_ns, cs_now_ns(), __ATOMIC_RELAXED);
    atomic_store_explicit(&w->seq, s + 2, memory_order_release);
}

/* A consistent copy of slot i, or 0 (empty, or being written) */
static int read_slot(unsigned i, wrap *out)
{
    wrap *w = &wraps[i];
    uint32_t s = atomic_load_explicit(&w->seq, memory_order_acquire);
    if (!s || (s & 1))
        return 0;
    out->data = __atomic_load_n(&w->data, __ATOMIC_RELAXED);
    out->lo = __atomic_load_n(&w->lo, __ATOMIC_RELAXED);
    out->hi = __atomic_load_n(&w->hi, __ATOMIC_RELAXED);
    out->stack = __atomic_load_n(&w->stack, __ATOMIC_RELAXED);
    out->time_ns = __atomic_load_n(&w->time_ns, __ATOMIC_RELAXED);
    atomic_thread_fence(memory_order_acquire);
    return atomic_load_explicit(&w->seq, memory_order_relaxed) == s;
}

int cs_npwrap_find(uintptr_t p, cs_event *out)
{
    if (!orig_new && !orig_new_descr)
        return 0;
    wrap w, best = {0};
    int found = read_slot(slot_of(p), &w) && w.data == p;
    if (found)
        best = w;
    /* an interior pointer (or an evicted exact one): the latest wrap whose
     * span holds p. A whole scan, but only when numpy frees memory that
     * no handler gave, which is already a finding. */
    for (unsigned i = 0; !found && i < NWRAPS; i++)
        if (read_slot(i, &w) && p >= w.lo && p < w.hi && w.time_ns >= best.time_ns) {
            best = w;
            found = 2;
        }
    if (!found)
        return 0;
    *out = (cs_event){.kind = CS_EV_NP_WRAP, .obj = p, .a = best.data, .b = best.hi - best.lo,
                      .c = best.lo, .stack = best.stack};
    return 1;
}

static PyObject_ *hook_new(void *subtype, int nd, const intptr_t *dims, int type_num,
                           const intptr_t *strides, void *data, int itemsize, int flags,
                           PyObject_ *obj)
{
    PyObject_ *r = orig_new(subtype, nd, dims, type_num, strides, data, itemsize, flags, obj);
    if (data && r && cs_recording)
        remember(r);
    return r;
}

static PyObject_ *hook_new_descr(void *subtype, void *descr, int nd, const intptr_t *dims,
                                 const intptr_t *strides, void *data, int flags, PyObject_ *obj)
{
    PyObject_ *r = orig_new_descr(subtype, descr, nd, dims, strides, data, flags, obj);
    if (data && r && cs_recording)
        remember(r);
    return r;
}

void cs_npwrap_install(void **api)
{
    static atomic_int done;
    if (!api || atomic_exchange(&done, 1))
        return;
    new_fn n = (new_fn)api[API_NEW];
    new_descr_fn nd = (new_descr_fn)api[API_NEW_FROM_DESCR];
    if (!n || !nd)
        return;
    orig_new = n;
    orig_new_descr = nd;
    /* the originals are set before an extension can reach a hook */
    atomic_thread_fence(memory_order_release);
    int ok = cs_probe_store(&api[API_NEW], (void *)hook_new) &&
             cs_probe_store(&api[API_NEW_FROM_DESCR], (void *)hook_new_descr);
    if (cs_opt.verbosity)
        dprintf(2, "==%d==capsan: numpy's C-API table: %s\n", (int)getpid(),
                ok ? "array constructors wrapped (foreign memory wraps are remembered)"
                   : "read-only, foreign memory wraps are not remembered");
}
