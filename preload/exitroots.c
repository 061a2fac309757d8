/* What the Python threads still running at a normal exit hold (see
 * exitroots.h). */
#include "exitroots.h"

#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "pabuffers.h"
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
        if (roots && cs_pyreach(roots, keys, n, found, NULL)) {
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

/* pa.array(ndarray) and pa.Table.from_pandas(df) wrap the array's memory
 * without a copy: a pyarrow buffer holds the array. When such an object
 * dies during finalization, pyarrow lets go of its buffer without the
 * reference (Python is going away), so the array outlives the process,
 * though the program held it properly. The buffers of the pyarrow objects
 * a module still reaches at atexit name those blocks (what the modules
 * reach through Python references alone finalization frees, or a lost
 * reference keeps: not held). */
static void pyarrow_buffers(void)
{
    uint64_t *keys = NULL;
    size_t n = cs_lc && cs_recording && cs_pa_imported()
                   ? cs_lc_exit_candidates(cs_lc, CS_NS_NUMPY, &keys) : 0;
    uint8_t *found = n ? malloc(n) : NULL;
    uint64_t *where = n ? calloc(n, sizeof *where) : NULL;
    if (found && where && cs_pyreach(cs_py.Import_GetModuleDict(), keys, n, found, where))
        for (size_t i = 0; i < n; i++)
            if (found[i] == CS_REACH_ARROW)
                note(keys[i], where[i], 0, CS_WHERE_ARROW_BUFFER);
    free(where);
    free(found);
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
