/* What the Python threads still running at a normal exit hold (see
 * exitroots.h). */
#include "exitroots.h"

#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "pyapi.h"
#include "pyreach.h"
#include "runtime.h"
#include "spin.h"
#include "thread.h"

/* PyMethodDef */
typedef struct method_def {
    const char *name;
    PyObject_ *(*meth)(PyObject_ *, PyObject_ *);
    int flags;
    const char *doc;
} method_def;
#define METH_NOARGS 0x0004

static atomic_int armed;
static cs_spin mu = CS_SPIN_INIT;
static cs_exit_held *held;
static size_t nheld, capheld;

static void note(uint64_t key, uint64_t where, uint32_t thread, unsigned region)
{
    cs_spin_lock(&mu);
    if (nheld == capheld) {
        size_t cap = capheld ? capheld * 2 : 64;
        cs_exit_held *t = realloc(held, cap * sizeof *t);
        if (!t) {
            cs_spin_unlock(&mu);
            return;
        }
        held = t, capheld = cap;
    }
    held[nheld++] = (cs_exit_held){key, where, thread, (uint16_t)region};
    cs_spin_unlock(&mu);
}

size_t cs_exitroots_held(cs_exit_held **out)
{
    cs_spin_lock(&mu);
    size_t n = nheld;
    *out = n ? malloc(n * sizeof **out) : NULL;
    if (*out)
        memcpy(*out, held, n * sizeof **out);
    else
        n = 0;
    cs_spin_unlock(&mu);
    return n;
}

static void xdecref(PyObject_ *o)
{
    if (o)
        cs_py.DecRef(o);
}

/* obj.name(): a new reference, or NULL */
static PyObject_ *call_attr(PyObject_ *obj, const char *name)
{
    PyObject_ *f = cs_py.Object_GetAttrString(obj, name);
    PyObject_ *r = f ? cs_py.Object_CallFunctionObjArgs(f, NULL) : NULL;
    xdecref(f);
    return r;
}

/* The local variables of frame f and of every frame it was called from,
 * as a list of lists: the roots of one thread. A new reference, or NULL. */
static PyObject_ *frame_roots(PyObject_ *f)
{
    PyObject_ *roots = cs_py.List_New(0);
    cs_py.IncRef(f);
    for (int depth = 0; roots && f && f != cs_py.None_ && depth < 10000; depth++) {
        PyObject_ *loc = cs_py.Object_GetAttrString(f, "f_locals");
        PyObject_ *vals = loc ? call_attr(loc, "values") : NULL;
        PyObject_ *list = vals ? cs_py.Sequence_List(vals) : NULL;
        if (!list || cs_py.List_Append(roots, list) < 0)
            cs_py.Err_Clear(); /* a frame being torn down: the next one */
        xdecref(list), xdecref(vals), xdecref(loc);
        PyObject_ *back = cs_py.Object_GetAttrString(f, "f_back");
        if (!back)
            cs_py.Err_Clear();
        cs_py.DecRef(f);
        f = back;
    }
    xdecref(f);
    return roots;
}

/* Every other thread's frames, walked for the live NumPy blocks */
static void walk_threads(void)
{
    uint64_t *keys = NULL;
    size_t n = cs_lc && cs_recording ? cs_lc_live_keys(cs_lc, CS_NS_NUMPY, &keys) : 0;
    uint8_t *found = n ? malloc(n) : NULL;
    PyObject_ *sys = found ? cs_py.Import_ImportModule("sys") : NULL;
    PyObject_ *frames = sys ? call_attr(sys, "_current_frames") : NULL;
    unsigned long me = cs_py.Thread_get_thread_ident();
    intptr_t pos = 0;
    PyObject_ *k, *f;
    while (frames && cs_py.Dict_Next(frames, &pos, &k, &f)) {
        unsigned long id = cs_py.Long_AsUnsignedLong(k);
        if (id == me)
            continue;
        PyObject_ *roots = frame_roots(f);
        if (roots && cs_pyreach(roots, keys, n, found)) {
            uint32_t num = cs_thread_num_of(id);
            for (size_t i = 0; i < n; i++)
                if (found[i])
                    note(keys[i], 0, num, CS_WHERE_THREAD_FRAMES);
        }
        xdecref(roots);
    }
    xdecref(frames), xdecref(sys);
    cs_py.Err_Clear(); /* atexit gets None, never an error of capsan's */
    free(found);
    free(keys);
}

/* ---- pyarrow objects made around NumPy arrays ----
 * pa.array(ndarray) and pa.Table.from_pandas(df) wrap the array's memory
 * without a copy: a pyarrow buffer holds the array. When such an object
 * dies during finalization, pyarrow lets go of its buffer without the
 * reference (Python is going away), so the array outlives the process,
 * though the program held it properly. The buffers of the pyarrow objects
 * a module still reaches at atexit name those blocks. */

typedef struct pa_objects {
    PyObject_ **v;
    size_t n, cap;
} pa_objects;

#define MAX_PA_OBJECTS 100000

static void collect_pa(PyObject_ *o, void *ud)
{
    pa_objects *l = ud;
    if (l->n == l->cap) {
        size_t cap = l->cap ? l->cap * 2 : 64;
        PyObject_ **v = l->n < MAX_PA_OBJECTS ? realloc(l->v, cap * sizeof *v) : NULL;
        if (!v) {
            cs_py.DecRef(o);
            return;
        }
        l->v = v, l->cap = cap;
    }
    l->v[l->n++] = o;
}

/* the block among the sorted keys whose bytes hold addr, or 0 */
static uint64_t block_of(const uint64_t *keys, const uint64_t *sizes, size_t n, uint64_t addr)
{
    size_t lo = 0, hi = n;
    while (lo < hi) { /* the first key above addr */
        size_t mid = lo + (hi - lo) / 2;
        if (keys[mid] <= addr)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo && addr - keys[lo - 1] < (sizes[lo - 1] ? sizes[lo - 1] : 1) ? keys[lo - 1] : 0;
}

/* each buffer of a pyarrow Array (its children's too: Array.buffers()) */
static void array_buffers(PyObject_ *arr, const uint64_t *keys, const uint64_t *sizes, size_t n)
{
    PyObject_ *bufs = call_attr(arr, "buffers");
    intptr_t nb = bufs ? cs_py.List_Size(bufs) : -1;
    for (intptr_t i = 0; i < nb; i++) {
        PyObject_ *b = cs_py.List_GetItem(bufs, i); /* borrowed; None for an absent one */
        PyObject_ *addr = b && b != cs_py.None_ ? cs_py.Object_GetAttrString(b, "address") : NULL;
        uint64_t a = addr ? cs_py.Long_AsUnsignedLong(addr) : 0;
        uint64_t key = a && a != (uint64_t)-1 ? block_of(keys, sizes, n, a) : 0;
        if (key)
            note(key, a, 0, CS_WHERE_ARROW_BUFFER);
        xdecref(addr);
    }
    xdecref(bufs);
    cs_py.Err_Clear();
}

static void pa_buffers(PyObject_ *o, const uint64_t *keys, const uint64_t *sizes, size_t n,
                       int depth);

/* each object of o.attr (a Table's columns, a ChunkedArray's chunks) */
static void each_of(PyObject_ *o, const char *attr, const uint64_t *keys, const uint64_t *sizes,
                    size_t n, int depth)
{
    PyObject_ *l = cs_py.Object_GetAttrString(o, attr);
    PyObject_ *list = l ? cs_py.Sequence_List(l) : NULL;
    intptr_t k = list ? cs_py.List_Size(list) : -1;
    for (intptr_t i = 0; i < k; i++)
        pa_buffers(cs_py.List_GetItem(list, i), keys, sizes, n, depth + 1);
    xdecref(list), xdecref(l);
    cs_py.Err_Clear();
}

static int has(PyObject_ *o, const char *attr)
{
    PyObject_ *a = cs_py.Object_GetAttrString(o, attr);
    if (!a)
        cs_py.Err_Clear();
    xdecref(a);
    return a != NULL;
}

/* An Array's buffers; a ChunkedArray's chunks'; a Table's or a
 * RecordBatch's columns' */
static void pa_buffers(PyObject_ *o, const uint64_t *keys, const uint64_t *sizes, size_t n,
                       int depth)
{
    if (!o || depth > 3)
        return;
    if (has(o, "buffers"))
        array_buffers(o, keys, sizes, n);
    else if (has(o, "chunks"))
        each_of(o, "chunks", keys, sizes, n, depth);
    else if (has(o, "columns"))
        each_of(o, "columns", keys, sizes, n, depth);
}

static void pyarrow_buffers(void)
{
    uint64_t *keys = NULL;
    size_t n = cs_lc && cs_recording ? cs_lc_exit_candidates(cs_lc, CS_NS_NUMPY, &keys) : 0;
    PyObject_ *modules = n && cs_py.Import_GetModuleDict ? cs_py.Import_GetModuleDict() : NULL;
    if (modules && !(cs_py.Dict_GetItemString && cs_py.Dict_GetItemString(modules, "pyarrow.lib")))
        modules = NULL; /* no pyarrow: no walk */
    uint64_t *sizes = modules ? calloc(n, sizeof *sizes) : NULL;
    if (sizes && cs_lc_sizes(cs_lc, CS_NS_NUMPY, keys, n, sizes)) {
        pa_objects l = {0};
        cs_pyreach_collect(modules, "pyarrow.lib.", collect_pa, &l);
        for (size_t i = 0; i < l.n; i++)
            pa_buffers(l.v[i], keys, sizes, n, 0);
        for (size_t i = 0; i < l.n; i++)
            cs_py.DecRef(l.v[i]);
        free(l.v);
    }
    free(sizes);
    if (keys)
        memset(keys, 0, n * sizeof *keys);
    free(keys);
}

static PyObject_ *at_exit(PyObject_ *self, PyObject_ *unused)
{
    (void)self, (void)unused;
    cs_thread *t = cs_thread_get();
    if (t)
        t->busy = 1; /* the scan's and walk's own allocations are no events */
    walk_threads();
    pyarrow_buffers();
    if (t)
        t->busy = 0;
    cs_py.IncRef(cs_py.None_);
    return cs_py.None_;
}

static method_def at_exit_def = {"capsan_exit_roots", at_exit, METH_NOARGS,
                                 "capsan: what the threads still running hold at exit"};

/* A pending call: the main thread, GIL held, between two bytecodes.
 * Registered first, it runs after the program's own atexit functions. */
static int register_at_exit(void *arg)
{
    (void)arg;
    PyObject_ *mod = cs_py.Import_ImportModule("atexit");
    PyObject_ *reg = mod ? cs_py.Object_GetAttrString(mod, "register") : NULL;
    PyObject_ *fn = reg ? cs_py.CFunction_NewEx(&at_exit_def, NULL, NULL) : NULL;
    PyObject_ *r = fn ? cs_py.Object_CallFunctionObjArgs(reg, fn, NULL) : NULL;
    if (!r)
        cs_py.Err_Clear(); /* a pending call's error would be the program's */
    xdecref(r), xdecref(fn), xdecref(reg), xdecref(mod);
    return 0;
}

void cs_exitroots_arm(void)
{
    if (cs_runtime_api_mode() || !cs_py.AddPendingCall || !cs_py.CFunction_NewEx ||
        !cs_py.Dict_Next || !cs_py.List_Append || !cs_py.Sequence_List || !cs_py.None_ ||
        !cs_py.Thread_get_thread_ident || !cs_py.Long_AsUnsignedLong ||
        !cs_py.Object_CallFunctionObjArgs || !cs_py.Import_ImportModule || !cs_py.Err_Clear ||
        atomic_exchange(&armed, 1))
        return;
    cs_py.AddPendingCall(register_at_exit, NULL);
}
