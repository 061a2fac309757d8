/* What the program still held as the interpreter began to exit: the other
 * threads' frames and the modules' globals, walked at atexit (see
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
#include "young.h"
#include "growclean.h"
#include "alloc.h"

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

/* module m + 1 when the record holds only if that module's globals were
 * never cleared (witnesses below), else 0 */
static void note_in(uint64_t key, int ns, uint64_t where, uint32_t thread, unsigned region,
                    uint32_t module)
{
    cs_spin_lock(&mu);
    if (nheld == capheld) {
        size_t cap = capheld ? capheld * 2 : 64;
        cs_exit_held *t = cs_grow_clean(held, nheld * sizeof *t, cap * sizeof *t);
        if (!t) {
            cs_spin_unlock(&mu);
            return;
        }
        held = t, capheld = cap;
    }
    held[nheld++] = (cs_exit_held){key, where, thread, (uint16_t)region, (uint8_t)ns, module};
    cs_spin_unlock(&mu);
}

static void note(uint64_t key, int ns, uint64_t where, uint32_t thread, unsigned region)
{
    note_in(key, ns, where, thread, region, 0);
}

/* The live blocks, tensors and Arrow structs a normal exit would judge, as
 * one sorted list (*ns: the namespace of each); returns how many */
static size_t candidates(uint64_t **keys, uint8_t **ns)
{
    static const uint8_t spaces[3] = {CS_NS_NUMPY, CS_NS_DLPACK, CS_NS_ARROW};
    uint64_t *part[3] = {NULL, NULL, NULL};
    size_t len[3] = {0, 0, 0}, at[3] = {0, 0, 0}, total = 0, n = 0;
    cs_young_flush(); /* the blocks still on their threads too */
    for (int s = 0; s < 3 && cs_lc && cs_recording; s++)
        total += len[s] = cs_lc_exit_candidates(cs_lc, spaces[s], &part[s]);
    *keys = total ? cs_malloc(total * sizeof **keys) : NULL;
    *ns = *keys ? cs_malloc(total) : NULL;
    if (!*ns) {
        cs_free(*keys);
        *keys = NULL;
    }
    /* the three sorted lists merged */
    for (; *ns && n < total; n++) {
        int best = -1;
        for (int s = 0; s < 3; s++)
            if (at[s] < len[s] && (best < 0 || part[s][at[s]] < part[best][at[best]]))
                best = s;
        (*keys)[n] = part[best][at[best]++];
        (*ns)[n] = spaces[best];
    }
    for (int s = 0; s < 3; s++) /* freed memory keeps its bytes: a stale key
                                 * would be a root to the exit's scans */
        cs_free_clean(part[s], len[s] * sizeof *part[s]);
    return n;
}


/* ---- module witnesses: whose globals the interpreter cleared ----
 * Finalization clears every module's globals, and so frees what they
 * alone held; a block still alive after it had another reference. Unless
 * the globals were never cleared: a function registered with a library
 * (a torch hook, a torch custom op, a tvm-ffi global function) keeps its
 * module's dict alive after the module is gone. A witness in each dict,
 * a capsule whose destructor notes the dict letting go of its values,
 * tells the exit which dicts were never cleared. */
#define MAX_MODULES 65536
#define WITNESS "__capsan_exit_witness__"
static uint8_t *cleared; /* per witness: its dict let go of it */
static uint32_t nwitness;

static void witness_gone(PyObject_ *cap)
{
    uintptr_t i = (uintptr_t)cs_py.Capsule_GetPointer(cap, "capsan.exit_witness");
    if (i && i <= nwitness && cleared)
        cleared[i - 1] = 1;
    cs_py.Err_Clear();
}

size_t cs_exitroots_held(cs_exit_held **out)
{
    cs_spin_lock(&mu);
    size_t n = 0;
    *out = nheld ? cs_malloc(nheld * sizeof **out) : NULL;
    for (size_t i = 0; *out && i < nheld; i++) {
        (*out)[n] = held[i];
        /* reached from a module's globals that finalization did clear, yet
         * still alive: something that outlived it still references it
         * (pytest's items hold their parameters and test instances to the
         * end, a library's cache its arrays). Reachable from live Python
         * objects at exit is live, as LeakSanitizer counts it; a lost
         * reference is one no Python object reached at atexit. */
        if (held[i].module && !(held[i].module <= nwitness && !cleared[held[i].module - 1]))
            (*out)[n].region = CS_WHERE_PY_REACHED;
        n++;
    }
    cs_spin_unlock(&mu);
    return n;
}

/* The local variables of frame f and of every frame it was called from,
 * as a list of lists: the roots of one thread. A new reference, or NULL. */
static PyObject_ *frame_roots(PyObject_ *f)
{
    PyObject_ *roots = cs_py.List_New(0);
    cs_py.IncRef(f);
    for (int depth = 0; roots && f && f != cs_py.None_ && depth < 10000; depth++) {
        PyObject_ *loc = cs_py.Object_GetAttrString(f, "f_locals");
        PyObject_ *vals = loc ? cs_py_call_method0(loc, "values") : NULL;
        PyObject_ *list = vals ? cs_py.Sequence_List(vals) : NULL;
        if (!list || cs_py.List_Append(roots, list) < 0)
            cs_py.Err_Clear(); /* a frame being torn down: the next one */
        cs_py_xdecref(list), cs_py_xdecref(vals), cs_py_xdecref(loc);
        PyObject_ *back = cs_py.Object_GetAttrString(f, "f_back");
        if (!back)
            cs_py.Err_Clear();
        cs_py.DecRef(f);
        f = back;
    }
    cs_py_xdecref(f);
    return roots;
}

/* The blocks and tensors a normal exit would judge (keys, sorted; ns[i]
 * the namespace of keys[i]), and the walks' answer for each */
typedef struct wanted {
    uint64_t *keys;
    uint8_t *ns, *found;
    size_t n;
} wanted;

/* The other Python threads still running at atexit, by capsan number. A
 * thread join()ed before has deleted its thread state, but its pthread
 * may not have ended yet (under load, not before _exit): it holds nothing
 * any more, and its tensors are not "held by a running thread". */
#define MAX_RUNNING 256
static uint32_t running[MAX_RUNNING];
static size_t nrunning;
static atomic_int running_known;

static void note_running(PyObject_ *frames)
{
    unsigned long me = cs_py.Thread_get_thread_ident();
    intptr_t pos = 0;
    PyObject_ *k, *f;
    size_t n = 0;
    while (cs_py.Dict_Next(frames, &pos, &k, &f)) {
        unsigned long id = cs_py.Long_AsUnsignedLong(k);
        uint32_t num = id == me ? 0 : cs_thread_num_of(id);
        if (!num)
            continue;
        if (n == MAX_RUNNING)
            return; /* too many to list: every thread counts as running */
        running[n++] = num;
    }
    nrunning = n;
    atomic_store(&running_known, 1);
}

int cs_exitroots_running(uint32_t thread)
{
    if (!atomic_load(&running_known))
        return 1;
    for (size_t i = 0; i < nrunning; i++)
        if (running[i] == thread)
            return 1;
    return 0;
}

/* Each other thread's frames, walked up to the modules' globals (dicts:
 * what those reach is the modules', and a thread's frames reach them all
 * through its functions) */
static void walk_threads(const wanted *w, PyObject_ *frames, PyObject_ *const *dicts, size_t nd)
{
    PyObject_ **roots = cs_malloc((nd + 1) * sizeof *roots);
    unsigned long me = cs_py.Thread_get_thread_ident();
    intptr_t pos = 0;
    PyObject_ *k, *f;
    if (roots)
        memcpy(roots + 1, dicts, nd * sizeof *dicts);
    while (roots && frames && cs_py.Dict_Next(frames, &pos, &k, &f)) {
        unsigned long id = cs_py.Long_AsUnsignedLong(k);
        if (id == me || !(roots[0] = frame_roots(f)))
            continue;
        if (cs_pyreach(roots, nd + 1, 1, w->keys, w->n, w->found, NULL, NULL)) {
            uint32_t num = cs_thread_num_of(id);
            for (size_t i = 0; i < w->n; i++)
                if (w->found[i])
                    note(w->keys[i], w->ns[i], 0, num, CS_WHERE_THREAD_FRAMES);
        }
        cs_py.DecRef(roots[0]);
    }
    cs_free(roots);
}

/* The loaded modules' dicts, each with its witness (new references) */
static size_t module_dicts(PyObject_ ***out)
{
    PyObject_ *modules = cs_py.Module_Type && cs_py.Module_GetDict && cs_py.Dict_SetItemString &&
                                 cs_py.Type_IsSubtype && cs_py.ob_type_off
                             ? cs_py.Import_GetModuleDict()
                             : NULL;
    size_t n = 0, cap = 0;
    PyObject_ **v = NULL;
    intptr_t pos = 0;
    PyObject_ *k, *m;
    while (modules && cs_py.Dict_Next(modules, &pos, &k, &m) && nwitness < MAX_MODULES) {
        /* modules only: an object put in sys.modules (a lazy loader) may
         * run code for its attributes */
        const void *tp = *(const void *const *)((const char *)m + cs_py.ob_type_off);
        if (tp != cs_py.Module_Type && !cs_py.Type_IsSubtype(tp, cs_py.Module_Type))
            continue;
        PyObject_ *d = cs_py.Module_GetDict(m); /* borrowed */
        if (d && cs_py.Dict_GetItemString(d, WITNESS))
            continue; /* one module under two names (os.path, posixpath) */
        if (d)
            cs_py.IncRef(d);
        PyObject_ *w = d ? cs_py.Capsule_New((void *)(uintptr_t)(nwitness + 1), "capsan.exit_witness",
                                             witness_gone)
                         : NULL;
        if (w && cs_py.Dict_SetItemString(d, WITNESS, w) == 0 &&
            (n < cap || (v = cs_realloc(v, (cap = cap ? cap * 2 : 256) * sizeof *v)))) {
            nwitness++;
            v[n++] = d;
            d = NULL;
        }
        cs_py_xdecref(w), cs_py_xdecref(d);
        cs_py.Err_Clear();
    }
    *out = v;
    return n;
}

/* What the loaded modules' globals reach at atexit. A block a module's
 * globals alone hold is freed when finalization clears them; if it is
 * alive at exit, an object that outlived finalization still holds it
 * (held), or those globals were never cleared (the witnesses say which).
 * And pa.array(
 * ndarray) or pa.Table.from_pandas(df) wrap an array's memory without a
 * copy: when such an object dies during finalization, pyarrow lets go of
 * its buffer without releasing the array (Python is going away), so the
 * block outlives the process though the program held it properly. */
static void module_roots(const wanted *w, PyObject_ *const *dicts, size_t nd, uint32_t witness0)
{
    uint64_t *where = cs_calloc(w->n, sizeof *where);
    uint32_t *label = cs_calloc(w->n, sizeof *label);
    if (where && label && nd && cs_pyreach(dicts, nd, nd, w->keys, w->n, w->found, where, label))
        for (size_t i = 0; i < w->n; i++) {
            if (w->found[i] == CS_REACH_ARROW)
                note(w->keys[i], w->ns[i], where[i], 0, CS_WHERE_ARROW_BUFFER);
            else if (w->found[i] == CS_REACH_OBJECT)
                note_in(w->keys[i], w->ns[i], 0, 0, CS_WHERE_MODULE_KEPT, witness0 + label[i]);
        }
    cs_free(label);
    cs_free(where);
}

static PyObject_ *at_exit(PyObject_ *self, PyObject_ *unused)
{
    (void)self, (void)unused;
    cs_thread *t = cs_thread_get();
    if (t)
        t->busy = 1; /* the walks' own allocations are no events */
    PyObject_ *sys = cs_py_module("sys");
    PyObject_ *frames = sys ? cs_py_call_method0(sys, "_current_frames") : NULL;
    if (frames)
        note_running(frames);
    wanted w = {0};
    /* only what an exit would judge is looked for: none, no walk */
    w.n = candidates(&w.keys, &w.ns);
    w.found = w.n ? cs_malloc(w.n) : NULL;
    if (!cleared)
        cleared = cs_calloc(MAX_MODULES, 1);
    if (w.found && cleared) {
        PyObject_ **dicts = NULL;
        size_t nd = module_dicts(&dicts);
        uint32_t witness0 = nwitness - (uint32_t)nd + 1; /* dicts[i]'s is witness0 + i */
        if (frames)
            walk_threads(&w, frames, dicts, nd);
        module_roots(&w, dicts, nd, witness0);
        for (size_t i = 0; i < nd; i++)
            cs_py.DecRef(dicts[i]);
        cs_free(dicts);
    }
    cs_free_clean(w.keys, w.n * sizeof *w.keys); /* no stale copy of a key */
    cs_free(w.ns), cs_free(w.found);
    cs_py_xdecref(frames);
    cs_py.Err_Clear(); /* atexit gets None, never an error of capsan's */
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
    cs_py_xdecref(r), cs_py_xdecref(fn), cs_py_xdecref(reg), cs_py_xdecref(mod);
    return 0;
}

void cs_exitroots_arm(void) { cs_exitroots_arm_threads(); }

void cs_exitroots_arm_threads(void)
{
    if (cs_runtime_api_mode() || !cs_py.AddPendingCall || !cs_py.CFunction_NewEx ||
        !cs_py.Dict_Next || !cs_py.List_Append || !cs_py.Sequence_List || !cs_py.None_ ||
        !cs_py.Thread_get_thread_ident || !cs_py.Long_AsUnsignedLong ||
        !cs_py.Object_CallFunctionObjArgs || !cs_py.Import_ImportModule || !cs_py.Err_Clear ||
        atomic_exchange(&armed, 1))
        return;
    cs_py.AddPendingCall(register_at_exit, NULL);
}
