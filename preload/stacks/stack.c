/* Stack capture and interning (see stack.h).
 *
 * Hot path: unwind + Python walk into a buffer, then an exact lookup in a
 * per-thread set-associative cache of whole stacks (a hit is the stack
 * that happened, never a near match). Misses insert into the global tree
 * under one mutex and write the new nodes to the trace. */
#include "stack.h"

#include <dlfcn.h>
#include <libunwind.h> /* types only: the functions come from dlsym */
#include <link.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <ucontext.h>

#include "libpath.h"
#include "options.h"
#include "probe.h"
#include "pyapi.h"
#include "spin.h"
#include "tracefile.h"

#define MAXF 256

/* ---- native: libunwind, loaded RTLD_LOCAL so its _Unwind_* and backtrace
 * never replace libgcc's for the host (C++ exceptions in torch) ---- */
static int (*unw_bt)(void **, int);
static int (*unw_policy)(void *, int);
static void (*unw_flush)(void *, uintptr_t, uintptr_t);
static void *unw_space;
/* libunwind's cursor API, for a walk that also says where each return
 * address is stored (a chain-cache miss) */
static int (*unw_ctx_get)(unw_context_t *);
static int (*unw_cur_init)(unw_cursor_t *, unw_context_t *);
static int (*unw_cur_step)(unw_cursor_t *);
static int (*unw_cur_reg)(unw_cursor_t *, unw_regnum_t, unw_word_t *);
/* for a crash: a walk from the signal's own context */
static int (*unw_cur_init2)(unw_cursor_t *, unw_context_t *, int);
static uintptr_t self_lo, self_hi;
static uintptr_t unw_lo, unw_hi; /* libunwind's code */
static uintptr_t eval_lo, eval_hi; /* _PyEval_EvalFrameDefault */

/* the executable segment holding range[0]: range[1], range[2] = [lo, hi) */
static int code_range_cb(struct dl_phdr_info *info, size_t size, void *data)
{
    (void)size;
    uintptr_t *range = data, a = range[0];
    for (int i = 0; i < info->dlpi_phnum; i++) {
        const ElfW(Phdr) *ph = &info->dlpi_phdr[i];
        uintptr_t lo = info->dlpi_addr + ph->p_vaddr, hi = lo + ph->p_memsz;
        if (ph->p_type == PT_LOAD && (ph->p_flags & PF_X) && a >= lo && a < hi) {
            range[1] = lo;
            range[2] = hi;
            return 1;
        }
    }
    return 0;
}

static int rw_kind; /* raw_walk's shape for this interpreter's frames */
static int rw_kind_of(const cs_pylayout *l);

void cs_stack_init(const void *self)
{
    if (cs_py.layout)
        rw_kind = rw_kind_of(cs_py.layout);
    uintptr_t range[3] = {(uintptr_t)self, 0, 0};
    dl_iterate_phdr(code_range_cb, range);
    self_lo = range[1];
    self_hi = range[2];
    /* where the interpreter's eval loop lives: with the GIL held, native
     * unwinding stops there and the Python frames take over */
    void *ev = dlsym(RTLD_DEFAULT, "_PyEval_EvalFrameDefault");
    Dl_info di;
    const ElfW(Sym) *sym = NULL;
    if (ev && dladdr1(ev, &di, (void **)&sym, RTLD_DL_SYMENT) && sym && sym->st_size) {
        eval_lo = (uintptr_t)ev;
        eval_hi = eval_lo + sym->st_size;
    }
    void *h = cs_libunwind_open(RTLD_NOW | RTLD_LOCAL);
    if (!h)
        return;
    unw_bt = (int (*)(void **, int))dlsym(h, "_ULx86_64_backtrace");
    if (!unw_bt)
        unw_bt = (int (*)(void **, int))dlsym(h, "unw_backtrace");
    int (*policy)(void *, int) = (int (*)(void *, int))dlsym(h, "_ULx86_64_set_caching_policy");
    void **as = dlsym(h, "_ULx86_64_local_addr_space");
    *(void **)&unw_flush = dlsym(h, "_Ux86_64_flush_cache");
    *(void **)&unw_ctx_get = dlsym(h, "_Ux86_64_getcontext");
    *(void **)&unw_cur_init = dlsym(h, "_ULx86_64_init_local");
    *(void **)&unw_cur_step = dlsym(h, "_ULx86_64_step");
    *(void **)&unw_cur_reg = dlsym(h, "_ULx86_64_get_reg");
    *(void **)&unw_cur_init2 = dlsym(h, "_ULx86_64_init_local2");
    uintptr_t ur[3] = {(uintptr_t)unw_cur_step, 0, 0};
    if (unw_cur_step)
        dl_iterate_phdr(code_range_cb, ur);
    unw_lo = ur[1];
    unw_hi = ur[2];
    if (as)
        unw_space = *as;
    unw_policy = policy;
}

void cs_stack_start(void)
{
    /* the first libunwind call initialises it, and that opens its memory
     * check pipe: only once unwfd.c's hooks are in its slots */
    if (unw_space && unw_policy)
        unw_policy(unw_space, 2 /* UNW_CACHE_PER_THREAD */);
}

static _Atomic uint32_t chains_gen;

void cs_stack_flush(void)
{
    /* the chain caches hold return addresses into what was unloaded */
    atomic_fetch_add(&chains_gen, 1);
    /* libunwind keys its cache by address: unloaded objects leave stale
     * entries; dropping all of it is cheap and rare */
    if (unw_flush && unw_space)
        unw_flush(unw_space, 0, 0);
}

/* ---- Python code objects, interned ----
 * Code objects and frames are read at the offsets of the running version
 * (pyversions.inc): the runtime is built without Python headers.
 *
 * With the GIL, a code object is interned for good: its names are copied
 * and a reference keeps its address from being reused. A thread that
 * released the GIL in C code (ctypes does around every foreign call) may
 * neither call into Python nor take a reference; but its own frames hold
 * their code objects, whose names are immutable str objects, so ASCII
 * names are read in place. Such an entry is weak: each later use first
 * checks that the object at that address still has the same name objects
 * and first line, else it is a new code object. */
typedef struct code_obj code_obj; /* a PyCodeObject, opaque */

#define AT(p, off, type) (*(type const *)((const char *)(p) + (off)))

typedef struct code_info {
    const char *file, *name;
    uint32_t firstlineno;
    int importlib; /* the import machinery itself: frames below run an import */
    int weak;      /* no reference held: check against (fobj, nobj) first */
    const void *fobj, *nobj;
    _Atomic uint32_t gen;  /* trace generation it was written in */
} code_info;

static cs_spin code_mu = CS_SPIN_INIT;
static code_obj **code_keys;   /* open addressing; strong refs unless weak */
static uint32_t *code_vals;
static size_t code_cap, code_used;
static code_info *_Atomic code_tab[4096]; /* chunks of 1024 */
static _Atomic uint32_t code_count;   /* ids are 1..code_count */

static code_info *code_at(uint32_t id)
{
    code_info *c = atomic_load_explicit(&code_tab[id >> 10], memory_order_acquire);
    return c ? &c[id & 1023] : NULL;
}

static void code_write(uint32_t id)
{
    code_info *c = code_at(id);
    uint32_t g = cs_trace_gen();
    if (!c || atomic_load(&c->gen) == g)
        return;
    atomic_store(&c->gen, g);
    cs_rec_code r = {.code_id = id, .firstlineno = c->firstlineno,
                     .filename_len = (uint32_t)strlen(c->file),
                     .name_len = (uint32_t)strlen(c->name)};
    const char *strs[2] = {c->file, c->name};
    cs_trace_write_strs(CS_REC_CODE, &r, sizeof r, strs, 2);
}

/* a str's text with the GIL (may fill its UTF-8 cache), or "?" */
static char *utf8_copy(PyObject_ *s)
{
    const char *u = s ? cs_py.Unicode_AsUTF8(s) : NULL;
    return strdup(u ? u : "?");
}

/* PyASCIIObject.state's compact and ascii bits (3.10-3.13) */
#define STR_COMPACT_ASCII ((1u << 5) | (1u << 6))

/* a compact ASCII str's text, read in place (no call, no GIL), or NULL */
static const char *ascii_in_place(const void *s)
{
    const cs_pylayout *l = cs_py.layout;
    if (!s)
        return NULL;
    uint32_t state = AT(s, l->str_state, uint32_t);
    return (state & STR_COMPACT_ASCII) == STR_COMPACT_ASCII ? (const char *)s + l->str_data : NULL;
}

/* the entry still describes the code object at its address */
static int code_same(const code_info *c, const code_obj *co)
{
    const cs_pylayout *l = cs_py.layout;
    return !c->weak || (AT(co, l->co_filename, const void *) == c->fobj &&
                        AT(co, l->co_name, const void *) == c->nobj &&
                        AT(co, l->co_firstlineno, int) == (int)c->firstlineno);
}

/* code_mu held: co's slot in the table (its key, or the empty slot where
 * it goes), the table grown first if needed; SIZE_MAX when out of memory */
static size_t code_slot(const code_obj *co)
{
    if ((code_used + 1) * 2 > code_cap) {
        size_t ncap = code_cap ? code_cap * 2 : 1024;
        code_obj **nk = calloc(ncap, sizeof *nk);
        uint32_t *nv = calloc(ncap, sizeof *nv);
        if (!nk || !nv) {
            free(nk);
            free(nv);
            if (code_used + 1 >= code_cap)
                return SIZE_MAX;
        } else {
            for (size_t j = 0; j < code_cap; j++) {
                if (!code_keys[j])
                    continue;
                size_t i = ((uintptr_t)code_keys[j] >> 4) & (ncap - 1);
                while (nk[i])
                    i = (i + 1) & (ncap - 1);
                nk[i] = code_keys[j];
                nv[i] = code_vals[j];
            }
            free(code_keys);
            free(code_vals);
            code_keys = nk;
            code_vals = nv;
            code_cap = ncap;
        }
    }
    size_t m = code_cap - 1, i = ((uintptr_t)co >> 4) & m;
    while (code_keys[i] && code_keys[i] != co)
        i = (i + 1) & m;
    return i;
}

/* code_mu held: a new id for co with these names, stored at slot i */
static uint32_t code_new(code_obj *co, size_t i, char *file, char *name, int weak)
{
    const cs_pylayout *l = cs_py.layout;
    uint32_t id = atomic_load(&code_count) + 1;
    if ((id >> 10) >= 4096 || !file || !name)
        goto fail;
    if (!atomic_load(&code_tab[id >> 10])) {
        code_info *chunk = calloc(1024, sizeof *chunk);
        if (!chunk)
            goto fail;
        atomic_store(&code_tab[id >> 10], chunk);
    }
    code_info *c = code_at(id);
    c->file = file;
    c->name = name;
    c->firstlineno = (uint32_t)AT(co, l->co_firstlineno, int);
    c->importlib = strncmp(file, "<frozen importlib", 17) == 0;
    c->weak = weak;
    c->fobj = AT(co, l->co_filename, const void *);
    c->nobj = AT(co, l->co_name, const void *);
    if (!code_keys[i])
        code_used++;
    code_keys[i] = co;
    code_vals[i] = id;
    atomic_store_explicit(&code_count, id, memory_order_release);
    return id;
fail:
    free(file);
    free(name);
    return 0;
}

/* co's id. With the GIL (gil = 1) it is interned for good; without it, a
 * weak entry is made if need be, and 0 is the answer when co's names are
 * not ASCII (they cannot be read without a call). 0 when out of memory. */
static uint32_t code_id(code_obj *co, int gil)
{
    const cs_pylayout *l = cs_py.layout;
    uint32_t id = 0;
    cs_spin_lock(&code_mu);
    size_t i = code_slot(co);
    if (i == SIZE_MAX)
        goto out;
    if (code_keys[i]) {
        code_info *c = code_at(code_vals[i]);
        if (code_same(c, co)) {
            if (gil && c->weak) {
                /* the object a GIL-less read saw: hold it from now on */
                cs_py.IncRef((PyObject_ *)co);
                c->weak = 0;
            }
            id = code_vals[i];
            goto out;
        }
        /* a weak entry's object died and its address was reused */
    }
    if (gil) {
        /* a pending exception must survive our string conversions (R5) */
        PyObject_ *et, *ev, *tb;
        cs_py.Err_Fetch(&et, &ev, &tb);
        char *file = utf8_copy(AT(co, l->co_filename, PyObject_ *));
        char *name = utf8_copy(AT(co, l->co_name, PyObject_ *));
        cs_py.Err_Restore(et, ev, tb);
        /* the code object must outlive its id: a reused address would
         * name a different function */
        if ((id = code_new(co, i, file, name, 0)))
            cs_py.IncRef((PyObject_ *)co);
    } else {
        const char *file = ascii_in_place(AT(co, l->co_filename, const void *));
        const char *name = ascii_in_place(AT(co, l->co_name, const void *));
        if (file && name)
            id = code_new(co, i, strdup(file), strdup(name), 1);
    }
out:
    cs_spin_unlock(&code_mu);
    return id;
}

int cs_stack_code(uint32_t id, const char **file, const char **name)
{
    if (!id || id > atomic_load(&code_count))
        return 0;
    code_info *c = code_at(id);
    *file = c->file;
    *name = c->name;
    return 1;
}

/* ---- per-thread caches ---- */
#define CSETS 128
#define CWAYS 2
#define CMAXF 64
#define LSETS 256

typedef struct centry {
    uint64_t hash;
    uint32_t id, n;
    int importing;
    uint64_t vals[CMAXF];
} centry;

/* The native frames from a hook's caller up to the eval loop, and where
 * each of their return addresses sits on the stack, relative to the slot
 * holding the caller's. If every one of those slots holds the same return
 * address again, the chain is the same and needs no unwinding: a few
 * loads instead of libunwind's ~12 ns a frame. */
#define RSETS 16
#define RWAYS 16 /* one call site (numpy's Track) can head many chains */
/* libunwind's cursor walk that learns a chain costs ~30 us (it masks
 * signals around every step): a thread earns one per LEARN_COST captures,
 * so a workload whose chains never repeat costs what it did before */
#define LEARN_COST 1024
#define LEARN_MAX (4 * LEARN_COST)
#define RMAXF 24
#define RMEMOS 2 /* memo_victim ^ 1 is the other */
#define PYMEMO 256 /* by a hash: two hot frees that share a place thrash it */
#define WALK_MAX (128 + 16) /* frames an unwind may fill: native_depth's 128 and capsan's */
typedef struct memo {
    uint32_t id, gen; /* gen: the trace its frames were written to */
    uint8_t npy, importing;
    /* raw: its frames (memo_frames) hold the same Python frames as the
     * interpreter holds them, each frame's code object and instruction,
     * each with its entry flag. Set once the stack repeats,
     * when capsan holds every one of those code objects (a code pointer
     * then names one object): it proves the memo without a line lookup */
    uint8_t raw;
} memo;

/* A memo's frames, apart from the chain (a chain relearnt in its place
 * resets the memo, not these), made at its first use: a deep stack's
 * (pytest's) Python frames are proven as cheaply as a loop's two */
#define MEMO_PY 32 /* python_depth's default */
typedef struct memo_frames {
    uint64_t py[MEMO_PY];
    const void *co[MEMO_PY];
    uint64_t ip[MEMO_PY]; /* raw_ip: the instruction and the entry flag */
} memo_frames;

typedef struct rentry {
    uintptr_t ret0;      /* the first return address outside capsan; 0 = empty */
    uint16_t n;          /* frames after it: up to the eval loop with the GIL,
                          * else as many as native_depth asks */
    uint8_t gil;         /* which of the two */
    uint32_t off[RMAXF]; /* slot of frame i, in words above ret0's slot */
    uintptr_t ip[RMAXF];
    /* the frames a stack shows, in order: ip[] without capsan's own (a
     * stub, a trampoline), so a hit copies them in one go (user-space
     * addresses: CS_FRAME_PY clear) */
    uint16_t nf;
    uintptr_t fip[RMAXF];
    /* the stacks this chain gave last, with their Python frames: a loop
     * repeats them, and then needs no hashing at all (two: numpy's alloc
     * chain serves np.empty and np.ones in one loop) */
    memo memo[RMEMOS];
    uint8_t memo_victim; /* the one a new stack replaces: not the last used */
} rentry;

/* cs_stack_importing's last walk (import_below) */
/* frames a memo keeps: a test under pytest runs 40 to 60 deep, and a
 * longer chain has no memo (its every allocation walks and reads names) */
#define IMEMO 128
/* by the top frame, two ways a set: a loop's allocations come from a few
 * top frames, next to each other when one call is a Python function
 * (np.ones): one way a set thrashed when two such frames met in a set */
#define IMEMOS 8
/* A chain's frames as the import check saw them: each one's code object
 * and file name (NULL: not code). The verdict depends on the file names
 * alone; a live frame holds its code and the code its name, so the same
 * pair of pointers again is the same name. f0, the chain's first frame,
 * tells a memo of another chain at once (a caller's chain differs in its
 * length alone). */
typedef struct imemo {
    int n, verdict;
    const char *f0;
    struct { const void *co, *fn; } fr[IMEMO];
} imemo;

typedef struct lentry { const void *code; int lasti; int line; uint32_t code_id; } lentry;

typedef struct cs_stack_cache {
    centry e[CSETS][CWAYS];
    rentry chain[RSETS][RWAYS];
    uint8_t chain_victim[RSETS];
    uint8_t chain_mru[RSETS];
    /* the way that matched after each way last time: a loop's call paths
     * come round in the same order */
    uint8_t chain_next[RSETS][RWAYS];
    uint8_t chain_next2[RSETS][RWAYS]; /* and the one that followed before that */
    uint32_t learn_credit;
    /* chains that missed, by a hash of their frames: a chain's second miss
     * learns it whatever the credit (it repeats: a walk pays for itself);
     * the low bit says its learning was tried (once per chain) */
    uint64_t missed[64];
    uint32_t chain_gen;  /* chains are forgotten when an object is unloaded */
    uintptr_t stack_lo, stack_hi; /* this thread's stack: the fast path
                                   * reads only inside it (not on a
                                   * sigaltstack, not on foreign stacks) */
    uint8_t victim[CSETS];
    /* (code, instruction) -> line, two ways a set, filled in turn:
     * one way a set thrashed when two hot frames met in a set (how code
     * objects lie in memory decides it: a PYTHONPATH entry more made
     * polars' round trip 13% dearer, PyCode_Addr2Line twice an iteration) */
    lentry lines[LSETS][2];
    uint8_t lvictim[LSETS];
    uint8_t eval_depth[32]; /* per site: raw frames up to the eval loop, learned */
    uint8_t ivictim[IMEMOS / 2]; /* the way of imemo's set a new walk takes */
    /* a Python-only stack's id by its frames (a NumPy free, a capture
     * without native frames): what the chain memo is for native chains */
    memo pymemo[PYMEMO]; /* by the top frame's code object and instruction */
    memo_frames *pyfr[PYMEMO];
    memo_frames *memofr[RSETS * RWAYS * RMEMOS]; /* by chain slot and memo */
    imemo imemo[IMEMOS];
} cs_stack_cache;

void cs_stack_cache_free(cs_stack_cache *c)
{
    if (!c)
        return;
    for (size_t i = 0; i < sizeof c->memofr / sizeof c->memofr[0]; i++)
        free(c->memofr[i]);
    for (int i = 0; i < PYMEMO; i++)
        free(c->pyfr[i]);
    free(c);
}

/* A memo's frames block, made at its first use when make */
static memo_frames *frames_at(memo_frames **slot, int make)
{
    if (!*slot && make)
        *slot = malloc(sizeof **slot);
    return *slot;
}

/* Chain e's k-th memo's frames */
static memo_frames *frames_of(cs_stack_cache *c, const rentry *e, int k, int make)
{
    return frames_at(&c->memofr[(size_t)(e - &c->chain[0][0]) * RMEMOS + (size_t)k], make);
}

/* The next frame of the chain that runs code, and whether `f` is the
 * outermost frame of its C-level evaluation (the native stack holds one
 * _PyEval_EvalFrameDefault per such group). */
static const char *code_frame(const cs_pylayout *l, const char *f)
{
    for (; f; f = AT(f, l->f_back, const char *)) {
        if (l->model == CS_PYF_OBJECT)
            return f;
        char owner = AT(f, l->f_owner, char);
        if (owner == l->owner_cstack)
            continue; /* the shim an evaluation starts with (3.12+) */
        const char *co = AT(f, l->f_code, const char *);
        if (!co || AT(co, sizeof(intptr_t), const void *) != cs_py.Code_Type)
            continue; /* 3.13's f_executable may be other than code */
        /* incomplete: set up, its first instruction not yet run */
        const char *first = co + l->co_code + 2 * AT(co, l->co_firsttraceable, int);
        if (owner != l->owner_gen && AT(f, l->f_instr, const char *) < first)
            continue;
        return f;
    }
    return NULL;
}

static int is_entry(const cs_pylayout *l, const char *f)
{
    if (l->f_entry >= 0)
        return AT(f, l->f_entry, char) != 0;
    if (l->owner_cstack < 0)
        return 1; /* 3.10: one evaluation a frame */
    const char *prev = AT(f, l->f_back, const char *);
    return !prev || AT(prev, l->f_owner, char) == l->owner_cstack;
}

/* The instruction a frame is at, in code units from the code's start
 * (what PyCode_Addr2Line wants, times two). */
static int frame_lasti(const cs_pylayout *l, const char *f, const char *co)
{
    if (l->model == CS_PYF_OBJECT)
        return AT(f, l->f_instr, int);
    return (int)((AT(f, l->f_instr, const char *) - (co + l->co_code)) / 2);
}

/* This thread's innermost frame that runs code, or NULL. gil == 0: the
 * thread released the GIL inside C code; its own frame chain cannot
 * change meanwhile. */
static inline __attribute__((always_inline)) const char *raw_top(const cs_pylayout *l, int gil)
{
    const char *ts = gil ? cs_py.ThreadState_UncheckedGet()
                         : (cs_py.GILState_GetThisThreadState
                                ? cs_py.GILState_GetThisThreadState() : NULL);
    if (ts && l->ts_cframe >= 0)
        ts = AT(ts, l->ts_cframe, const char *); /* the _PyCFrame */
    return ts ? AT(ts, l->cur, const char *) : NULL;
}

static const char *top_frame(const cs_pylayout *l, int gil)
{
    return code_frame(l, raw_top(l, gil));
}

/* Does an import machinery frame lie at f or below it? Only the file name
 * is read, in place, so nothing is interned. The thread's answers are kept
 * with the chains they walked (imemo): the same frames again need only
 * loads and compares, no names. */

/* m holds the chain from f as it is now: its verdict, or -1 */
static inline int imemo_verdict(const cs_pylayout *l, const char *f, const imemo *m)
{
    const ptrdiff_t o_code = l->f_code, o_back = l->f_back, o_file = l->co_filename;
    const int n = m->n;
    if (!n || f != m->f0)
        return -1;
    int i = 0;
    const char *g = f;
    for (; g && i < n; i++, g = AT(g, o_back, const char *)) {
        const char *co = AT(g, o_code, const char *);
        if (co != m->fr[i].co || (m->fr[i].fn && AT(co, o_file, const void *) != m->fr[i].fn))
            return -1;
    }
    return i == n && !g ? m->verdict : -1;
}

/* Whether an importlib frame lies in the chain from f: walked, and the
 * chain kept in m (if any) for imemo_verdict */
static int import_below(const cs_pylayout *l, const char *f, imemo *m)
{
    const char *f0 = f;
    int verdict = 0, i;
    for (i = 0; f && i < 1024; i++, f = AT(f, l->f_back, const char *)) {
        const char *co = AT(f, l->f_code, const char *);
        const void *fn = NULL;
        /* a shim's or 3.13's non-code executable is no import */
        if (co && AT(co, sizeof(intptr_t), const void *) == cs_py.Code_Type) {
            fn = AT(co, l->co_filename, const void *);
            const char *file = ascii_in_place(fn);
            if (file && file[0] == '<' && strncmp(file, "<frozen importlib", 17) == 0)
                verdict = 1;
        }
        if (m && i < IMEMO) {
            m->fr[i].co = co;
            m->fr[i].fn = fn;
        }
    }
    if (m) {
        m->f0 = f0;
        m->n = !f && i <= IMEMO ? i : 0; /* a whole chain, or no memo */
        m->verdict = verdict;
    }
    return verdict;
}

static cs_stack_cache *cache_of(cs_thread *t);

int cs_stack_importing(cs_thread *t, int gil)
{
    const cs_pylayout *l = cs_py.layout;
    if (!cs_py.ok || !l || !(gil || cs_py_live()))
        return 0;
    cs_stack_cache *c = cache_of(t);
    /* from the innermost frame as the thread state holds it: a shim or a
     * frame not yet started above the first that runs code is no import,
     * and the memo holds whatever chain it walked */
    const char *f = t->py_walked ? t->py_rest : raw_top(l, gil);
    if (!c || !f)
        return import_below(l, f, NULL);
    uintptr_t h = (uintptr_t)f >> 4;
    unsigned k = (unsigned)((h ^ h >> 6) % (IMEMOS / 2));
    imemo *set = &c->imemo[2 * k];
    unsigned w = c->ivictim[k] ^ 1u; /* the way used last, first */
    int v = imemo_verdict(l, f, &set[w]);
    if (v < 0 && (v = imemo_verdict(l, f, &set[w ^ 1])) >= 0)
        c->ivictim[k] = (uint8_t)w; /* the other way is the last used now */
    if (v >= 0)
        return v;
    w = c->ivictim[k];
    c->ivictim[k] = (uint8_t)(w ^ 1);
    return import_below(l, f, &set[w]);
}

/* A frame's instruction as one number: f_lasti (3.10) or the pointer to
 * the instruction (3.11+) */
static uint64_t frame_instr(const cs_pylayout *l, const char *f)
{
    return l->model == CS_PYF_OBJECT ? (uint64_t)(uint32_t)AT(f, l->f_instr, int)
                                     : (uint64_t)(uintptr_t)AT(f, l->f_instr, const char *);
}

int cs_stack_py_pos(int gil, cs_py_pos *pos)
{
    const cs_pylayout *l = cs_py.layout;
    const char *f = cs_py.ok && l && (gil || cs_py_live()) ? top_frame(l, gil) : NULL;
    pos->frame = (uint64_t)(uintptr_t)f;
    pos->instr = f ? frame_instr(l, f) : 0;
    return f != NULL;
}

int cs_stack_py_within(int gil, const cs_py_pos *pos)
{
    const cs_pylayout *l = cs_py.layout;
    if (!pos->frame || !cs_py.ok || !l || !(gil || cs_py_live()))
        return 0;
    const char *f = top_frame(l, gil);
    for (int k = 0; f && k < 4096; k++, f = code_frame(l, AT(f, l->f_back, const char *)))
        if ((uint64_t)(uintptr_t)f == pos->frame)
            return frame_instr(l, f) == pos->instr;
    return 0;
}

/* A frame's instruction with its entry flag, as a memo keeps it */
static inline uint64_t raw_ip(uint64_t instr, unsigned entry)
{
    return instr << 1 | entry;
}

/* What python_frames saw, for a memo (memo_frames.co, .ip): valid when
 * every frame's code object is one capsan holds */
typedef struct raw_frames {
    int strong;
    const void *co[MEMO_PY];
    uint64_t ip[MEMO_PY];
} raw_frames;

/* gil == 0: nothing may be interned. *rest: the first frame not recorded. */
static int python_frames(cs_stack_cache *c, const char *f, uint64_t *out, int max, int gil,
                         int *importing, const char **rest, raw_frames *raw)
{
    const cs_pylayout *l = cs_py.layout;
    int n = 0;
    for (; f && n < max; f = code_frame(l, AT(f, l->f_back, const char *))) {
        code_obj *co = AT(f, l->f_code, code_obj *);
        int lasti = frame_lasti(l, f, (const char *)co);
        unsigned slot = (unsigned)(((uintptr_t)co >> 4) ^ (unsigned)lasti * 2654435761u) % LSETS;
        int line;
        uint32_t id;
        lentry *w = c->lines[slot];
        if (w[0].code == co && w[0].lasti == lasti) {
            line = w[0].line;
            id = w[0].code_id;
        } else if (w[1].code == co && w[1].lasti == lasti) {
            line = w[1].line;
            id = w[1].code_id;
        } else {
            id = code_id(co, gil);
            if (!id)
                break;
            line = cs_py.Code_Addr2Line(co, lasti * 2);
            if (!code_at(id)->weak) { /* a weak entry is checked at each use */
                w[c->lvictim[slot]] = (lentry){.code = co, .lasti = lasti, .line = line, .code_id = id};
                c->lvictim[slot] ^= 1;
            }
        }
        if (code_at(id)->importlib)
            *importing = 1;
        int entry = is_entry(l, f);
        if (raw && n < MEMO_PY) {
            raw->strong &= !code_at(id)->weak;
            raw->co[n] = co;
            raw->ip[n] = raw_ip(frame_instr(l, f), entry);
        }
        out[n++] = CS_FRAME_PY_VALUE(id, line < 0 ? 0 : line, entry);
    }
    *rest = f;
    return n;
}

/* A walk cut short (a code object capsan could not name) or made
 * without a hold on every code object is no raw memo (the caller says) */
static void memo_raw_set(memo *m, memo_frames *fr, const raw_frames *raw, int npy)
{
    m->raw = 1;
    memcpy(fr->co, raw->co, (size_t)npy * sizeof raw->co[0]);
    memcpy(fr->ip, raw->ip, (size_t)npy * sizeof raw->ip[0]);
}

/* raw_same's walk of npy frames from *fp, one shape per frame model (a
 * constant where it is inlined, so a frame costs its loads and two
 * compares): RW_FIELD, an instruction pointer and an is_entry field
 * (3.11); RW_SHIM, an instruction pointer, and entries are the frames
 * right above a C-stack shim (3.12+); RW_ANY, whatever the layout says. */
enum { RW_FIELD, RW_SHIM, RW_ANY };

/* A shim or a frame not yet started lies at f where a memo has code co:
 * the next frame that runs code must hold co (a frame that runs other
 * code is its own next such frame). That frame, or NULL. */
static __attribute__((noinline)) const char *code_frame_holding(const cs_pylayout *l,
                                                                const char *f, const void *co)
{
    const char *g = code_frame(l, f);
    return g != f && g && AT(g, l->f_code, const void *) == co ? g : NULL;
}

static inline __attribute__((always_inline)) int raw_walk(const cs_pylayout *l,
                                                          const memo_frames *fr, const char **fp,
                                                          int npy, const int kind)
{
    /* pointer-wide offsets: no widening in the loop */
    const ptrdiff_t o_code = l->f_code, o_back = l->f_back, o_instr = l->f_instr,
                    o_entry = l->f_entry, o_owner = l->f_owner;
    const char cstack = (char)l->owner_cstack;
    const int by_index = kind == RW_ANY && l->model == CS_PYF_OBJECT;
    const char *f = *fp;
    const void *const *co = fr->co, *const *end = co + npy;
    const uint64_t *want = fr->ip;
    for (; co != end; co++, want++) {
        if (!f)
            return 0;
        if (__builtin_expect(AT(f, o_code, const void *) != *co, 0) &&
            !(f = code_frame_holding(l, f, *co)))
            return 0;
        const char *back = AT(f, o_back, const char *);
        uint64_t ip = by_index ? (uint64_t)(uint32_t)AT(f, o_instr, int)
                               : (uint64_t)(uintptr_t)AT(f, o_instr, const char *);
        /* is_entry's rules, each a constant here (the shared form cost W1
         * 90 instructions an iteration). Its field is a C bool: 0 or 1 as
         * it lies (any other byte fails the compare, as a changed frame
         * would) */
        unsigned entry = kind == RW_FIELD  ? AT(f, o_entry, unsigned char)
                         : kind == RW_SHIM ? !back || AT(back, o_owner, char) == cstack
                                           : (unsigned)is_entry(l, f);
        if (raw_ip(ip, entry) != *want)
            return 0;
        f = back;
    }
    *fp = f;
    return 1;
}

static int rw_kind_of(const cs_pylayout *l)
{
    if (l->model != CS_PYF_OBJECT && l->f_entry >= 0)
        return RW_FIELD;
    if (l->model != CS_PYF_OBJECT && l->owner_cstack >= 0 && l->f_owner >= 0)
        return RW_SHIM;
    return RW_ANY;
}

/* The thread's Python frames are the memo's, as raw_frames recorded
 * them: the same code objects at the same instructions (so the same
 * lines), entry frames alike, and the walk ends where it did (the stack's
 * end, or max frames on). *rest as python_frames says it. A deep stack
 * (pytest's) proves 32 frames an event. */
static inline __attribute__((always_inline)) int raw_same(const memo *m, const memo_frames *fr,
                                                         const char *f, int max, const char **rest)
{
    const cs_pylayout *l = cs_py.layout;
    const int npy = m->npy;
    int same = rw_kind == RW_FIELD  ? raw_walk(l, fr, &f, npy, RW_FIELD)
               : rw_kind == RW_SHIM ? raw_walk(l, fr, &f, npy, RW_SHIM)
                                    : raw_walk(l, fr, &f, npy, RW_ANY);
    if (!same)
        return 0;
    f = code_frame(l, f);
    if (f && npy < max)
        return 0; /* deeper than the memo's stack */
    *rest = f;
    return 1;
}

/* A memo's stack: its frames written to this trace once per file */
static uint32_t memo_use(cs_thread *t, memo *m, uint32_t gen)
{
    if (m->gen != gen) {
        cs_stack_ensure(m->id);
        m->gen = gen;
    }
    t->importing = m->importing;
    return m->id;
}

/* a few words: inline, where memcmp's call costs more than the compare */
static inline int same_words(const uint64_t *a, const uint64_t *b, int n)
{
    for (int i = 0; i < n; i++)
        if (a[i] != b[i])
            return 0;
    return 1;
}

/* The memo holds these npy Python frame values; raw (the walk's raw
 * frames, when they may prove it) is kept for the next repeat */
static inline __attribute__((always_inline)) int memo_repeats(memo *m, memo_frames *fr,
                                                             const uint64_t *py, int npy,
                                                             const raw_frames *raw)
{
    if (!m->id || m->npy != npy || !fr || !same_words(fr->py, py, npy))
        return 0;
    if (raw) /* it repeats: prove it from the raw frames next time */
        memo_raw_set(m, fr, raw, npy);
    return 1;
}

static void memo_store(memo *m, memo_frames *fr, uint32_t id, uint32_t gen, int importing,
                       const uint64_t *py, int npy)
{
    m->id = id;
    m->gen = gen;
    m->npy = (uint8_t)npy;
    m->importing = (uint8_t)importing;
    memcpy(fr->py, py, (size_t)npy * sizeof py[0]);
    m->raw = 0; /* proven from the raw frames once it repeats */
}

/* ---- the tree ---- */
typedef struct node {
    uint32_t parent;
    _Atomic uint32_t gen;
    uint64_t value;
} node;

#define NCHUNK 65536
static node *_Atomic node_tab[4096];
static uint32_t node_count; /* ids 1..node_count; 0 is the empty stack */
static uint32_t *map_ids;   /* open addressing over (parent, value) */
static size_t map_cap;
static pthread_mutex_t tree_mu = PTHREAD_MUTEX_INITIALIZER;

static node *node_at(uint32_t id)
{
    node *c = atomic_load_explicit(&node_tab[id / NCHUNK], memory_order_acquire);
    return c ? &c[id % NCHUNK] : NULL;
}

static inline uint64_t hmix(uint64_t a, uint64_t b)
{
    uint64_t h = a * 0x9e3779b97f4a7c15ull ^ b;
    h ^= h >> 31;
    h *= 0xbf58476d1ce4e5b9ull;
    return h ^ (h >> 29);
}

static void node_emit(uint32_t id)
{
    node *nd = node_at(id);
    if (!nd)
        return;
    atomic_store(&nd->gen, cs_trace_gen());
    if (CS_FRAME_IS_PY(nd->value))
        code_write(CS_FRAME_PY_CODE(nd->value));
    cs_rec_frame r = {.id = id, .parent = nd->parent, .value = nd->value};
    cs_trace_write(CS_REC_FRAME, &r, sizeof r);
}

/* tree_mu held */
static uint32_t node_get(uint32_t parent, uint64_t value)
{
    if ((node_count + 1) * 2 > map_cap) {
        size_t ncap = map_cap ? map_cap * 2 : 4096;
        uint32_t *nm = calloc(ncap, sizeof *nm);
        if (!nm)
            return 0;
        for (size_t j = 0; j < map_cap; j++) {
            uint32_t id = map_ids[j];
            if (!id)
                continue;
            node *nd = node_at(id);
            size_t i = hmix(nd->parent, nd->value) & (ncap - 1);
            while (nm[i])
                i = (i + 1) & (ncap - 1);
            nm[i] = id;
        }
        free(map_ids);
        map_ids = nm;
        map_cap = ncap;
    }
    size_t m = map_cap - 1, i;
    for (i = hmix(parent, value) & m; map_ids[i]; i = (i + 1) & m) {
        node *nd = node_at(map_ids[i]);
        if (nd->parent == parent && nd->value == value)
            return map_ids[i];
    }
    uint32_t id = node_count + 1;
    if (id / NCHUNK >= 4096)
        return 0;
    if (!atomic_load(&node_tab[id / NCHUNK])) {
        node *chunk = calloc(NCHUNK, sizeof *chunk);
        if (!chunk)
            return 0;
        atomic_store(&node_tab[id / NCHUNK], chunk);
    }
    node *nd = node_at(id);
    nd->parent = parent;
    nd->value = value;
    node_count = id;
    map_ids[i] = id;
    node_emit(id);
    return id;
}

static uint32_t tree_insert(const uint64_t *vals, int n)
{
    uint32_t parent = 0;
    pthread_mutex_lock(&tree_mu);
    /* outermost first, so stacks share their roots */
    for (int i = n - 1; i >= 0 && (i == n - 1 || parent); i--)
        parent = node_get(parent, vals[i]);
    pthread_mutex_unlock(&tree_mu);
    /* nodes made before a fork are in the parent's trace only: the
     * child's gets them when first used there */
    cs_stack_ensure(parent);
    return parent;
}

void cs_stack_ensure(uint32_t id)
{
    node *nd;
    if (!id || !(nd = node_at(id)) || atomic_load(&nd->gen) == cs_trace_gen())
        return;
    uint32_t chain[MAXF * 2];
    int n = 0;
    pthread_mutex_lock(&tree_mu);
    for (uint32_t x = id; x && n < (int)(sizeof chain / sizeof chain[0]); x = node_at(x)->parent) {
        if (atomic_load(&node_at(x)->gen) == cs_trace_gen())
            break;
        chain[n++] = x;
    }
    while (n > 0)
        node_emit(chain[--n]);
    pthread_mutex_unlock(&tree_mu);
}

int cs_stack_raw(uint32_t id, uint64_t *vals, int max)
{
    int n = 0;
    for (uint32_t x = id; x && n < max; x = node_at(x)->parent)
        vals[n++] = node_at(x)->value;
    return n;
}

static void thread_stack(cs_stack_cache *c)
{
    pthread_attr_t a;
    void *lo;
    size_t sz;
    c->stack_lo = c->stack_hi = 0;
    if (pthread_getattr_np(pthread_self(), &a) == 0) {
        if (pthread_attr_getstack(&a, &lo, &sz) == 0) {
            c->stack_lo = (uintptr_t)lo;
            c->stack_hi = (uintptr_t)lo + sz;
        }
        pthread_attr_destroy(&a);
    }
}

/* The stack slot holding the first return address outside capsan: capsan
 * is built with frame pointers, so its own frames chain through rbp up to
 * the hook that foreign code called. */
__thread const uintptr_t *cs_stack_hint __attribute__((tls_model("initial-exec")));

static inline uintptr_t *foreign_slot(uintptr_t *fp, uintptr_t lo, uintptr_t hi, int *levels)
{
    for (int i = 0; i < 16; i++) {
        if ((uintptr_t)fp < lo || (uintptr_t)fp + 16 > hi)
            return NULL;
        if (fp[1] < self_lo || fp[1] >= self_hi) {
            *levels = i;
            return &fp[1];
        }
        uintptr_t *up = (uintptr_t *)fp[0];
        if (up <= fp)
            return NULL;
        fp = up;
    }
    return NULL;
}

static int chain_valid(const rentry *e, const uintptr_t *slot0, size_t room, uintptr_t ret0, int gil)
{
    if (e->ret0 != ret0 || e->gil != gil)
        return 0;
    /* the chains of one call site share their inner frames and part
     * ways near the caller: the outermost slots tell them apart first */
    if (e->n && e->off[e->n - 1] >= room)
        return 0;
    for (uint32_t i = e->n; i-- > 0;)
        if (slot0[e->off[i]] != e->ip[i])
            return 0;
    return 1;
}

static rentry *chain_hit(cs_stack_cache *c, const uintptr_t *slot0, int gil)
{
    uintptr_t ret0 = *slot0;
    unsigned s = (unsigned)((ret0 >> 4) % RSETS);
    rentry *set = c->chain[s];
    size_t room = (c->stack_hi - (uintptr_t)slot0) / sizeof *slot0;
    /* first the chain that followed the last one's last time, then the
     * last one itself: loops repeat both */
    unsigned last = c->chain_mru[s], next = c->chain_next[s][last], next2 = c->chain_next2[s][last];
    if (chain_valid(&set[next], slot0, room, ret0, gil)) {
        c->chain_mru[s] = (uint8_t)next;
        return &set[next];
    }
    /* the one before it: a chain followed by two others in turn (numpy 2's
     * temporaries, sized apart) */
    if (next2 != next && chain_valid(&set[next2], slot0, room, ret0, gil)) {
        c->chain_next2[s][last] = (uint8_t)next;
        c->chain_next[s][last] = (uint8_t)next2;
        c->chain_mru[s] = (uint8_t)next2;
        return &set[next2];
    }
    if (next != last && next2 != last && chain_valid(&set[last], slot0, room, ret0, gil)) {
        c->chain_next2[s][last] = (uint8_t)next;
        c->chain_next[s][last] = (uint8_t)last;
        return &set[last];
    }
    for (unsigned w = 0; w < RWAYS; w++)
        if (w != last && w != next && w != next2 && chain_valid(&set[w], slot0, room, ret0, gil)) {
            c->chain_next2[s][last] = (uint8_t)next;
            c->chain_next[s][last] = (uint8_t)w;
            c->chain_mru[s] = (uint8_t)w;
            return &set[w];
        }
    return NULL;
}

/* Miss: walk with the cursor API up to the eval loop, noting where each
 * return address is stored, and remember the chain. Fills ips like
 * unw_backtrace; returns how many, or -1 if this walk cannot be used. */
static int chain_walk(cs_stack_cache *c, const uintptr_t *slot0, void **ips, int gil, int nd)
{
    unw_context_t uc;
    unw_cursor_t cur;
    if (unw_ctx_get(&uc) < 0 || unw_cur_init(&cur, &uc) < 0)
        return -1;
    uintptr_t sps[WALK_MAX];
    int n = 0, first = -1, cut = -1;
    do {
        unw_word_t ip = 0, sp = 0;
        if (unw_cur_reg(&cur, UNW_REG_IP, &ip) < 0 || unw_cur_reg(&cur, UNW_REG_SP, &sp) < 0 || !ip)
            break;
        ips[n] = (void *)(uintptr_t)ip;
        sps[n] = (uintptr_t)sp;
        if (first < 0 && sp - sizeof(uintptr_t) == (uintptr_t)slot0)
            first = n;
        n++;
        if (gil && ip >= eval_lo && ip < eval_hi) {
            cut = n - 1;
            break;
        }
        /* far enough past the first foreign frame (however many of
         * capsan's frames lie above it: this walk may be made one call
         * deeper than a capture's) for the frames a stack keeps */
        if (first >= 0 && n - 1 - first >= nd + 4)
            break;
    } while (n < WALK_MAX && unw_cur_step(&cur) > 0);
    if (!gil || cut < 0)
        cut = n - 1; /* no eval loop cut (or none within max): the chain is all that was walked */
    /* a stack keeps nd native frames: the chain needs the frames up to
     * the nd-th foreign one, not the rest of the way to the eval loop
     * (deep C++ and Rust paths) */
    int len = 0;
    for (int kept = 1, i = first + 1; first >= 0 && i <= cut && kept < nd; i++, len++)
        if ((uintptr_t)ips[i] < self_lo || (uintptr_t)ips[i] >= self_hi)
            kept++;
    if (first >= 0 && len > 0 && len <= RMAXF) {
        rentry e = {.ret0 = *slot0, .n = (uint16_t)len, .gil = (uint8_t)gil};
        for (int i = first + 1; i <= first + len; i++) {
            const uintptr_t *at = (const uintptr_t *)(sps[i] - sizeof(uintptr_t));
            if (at <= slot0 || *at != (uintptr_t)ips[i])
                return n; /* not a plain call chain (signal frame): not cached */
            e.off[i - first - 1] = (uint32_t)(at - slot0);
            e.ip[i - first - 1] = (uintptr_t)ips[i];
            if ((uintptr_t)ips[i] < self_lo || (uintptr_t)ips[i] >= self_hi)
                e.fip[e.nf++] = (uintptr_t)ips[i];
        }
        unsigned set = (unsigned)((e.ret0 >> 4) % RSETS);
        c->chain_mru[set] = c->chain_victim[set];
        c->chain[set][c->chain_victim[set]] = e;
        c->chain_victim[set] = (uint8_t)((c->chain_victim[set] + 1) % RWAYS);
    }
    return n;
}

static uint32_t stack_id(cs_thread *t, const uint64_t *vals, int n, int importing);

/* A miss that libunwind answered (ips, got frames): on the same chain's
 * second miss, learn it (a walk of its own, from this same frame). */
static void learn_if_repeated(cs_stack_cache *c, const uintptr_t *slot0, void *const *ips, int got,
                              int gil, int nd)
{
    uint64_t h = 0x9e3779b97f4a7c15ull * (uint64_t)(gil + 1);
    for (int i = 0; i < got; i++)
        h = (h ^ (uint64_t)(uintptr_t)ips[i]) * 0x100000001b3ull;
    h = hmix(h, (uint64_t)got) & ~1ull;
    uint64_t *m = &c->missed[(h >> 1) & 63];
    if ((*m & ~1ull) != h) {
        *m = h; /* its first miss */
        return;
    }
    if (*m & 1)
        return; /* learnt once already: it did not stay (or cannot be kept) */
    *m = h | 1;
    void *scratch[WALK_MAX];
    chain_walk(c, slot0, scratch, gil, nd);
}

/* No chain hit: unwind (the chain's own walk when it may learn, else
 * libunwind) and append the foreign frames below capsan's to vals[n..];
 * returns the new count. Cold: a loop's stacks come from chain hits. */
static __attribute__((noinline)) int walk_native(cs_thread *t, const uintptr_t *slot0,
                                                 const uintptr_t *first, int levels, int gil,
                                                 int nd, unsigned site, uint64_t *vals, int n)
{
    void *ips[WALK_MAX];
    /* capsan's own frames (this one, capture, emit, the hook and what
     * lies between) sit on top: as many as the frame pointers said, else
     * the usual three, and this function's */
    int self = (first ? levels + 1 : 3) + 1;
    int full = nd + self, cut = -1;
    if (full > WALK_MAX)
        full = WALK_MAX;
    uint8_t *hint = &t->cache->eval_depth[site & 31];
    int got = -1, walked = 0;
    if (slot0 && t->cache->learn_credit >= LEARN_COST) {
        t->cache->learn_credit -= LEARN_COST;
        got = chain_walk(t->cache, slot0, ips, gil, nd);
        walked = 1;
    }
    int want = full;
    if (got < 0) {
        /* libunwind walks as many frames as asked: ask for about as
         * many as it took to reach the eval loop from here last time */
        want = gil && eval_hi && *hint && *hint < full ? *hint : full;
        got = unw_bt(ips, want);
    }
    for (int pass = 0; pass < 2; pass++) {
        if (gil && eval_hi)
            for (int i = 0; i < got; i++)
                if ((uintptr_t)ips[i] >= eval_lo && (uintptr_t)ips[i] < eval_hi) {
                    cut = i;
                    break;
                }
        if (cut >= 0 || want == full || got < want)
            break;
        want = full; /* deeper this time: the whole walk */
        got = unw_bt(ips, want);
    }
    if (gil && eval_hi)
        *hint = (uint8_t)(cut >= 0 ? (cut + 1 > *hint ? cut + 1 : *hint) : full);
    if (cut >= 0)
        got = cut + 1; /* keep the eval frame: the Python frames go there */
    if (slot0 && !walked && got > 0)
        learn_if_repeated(t->cache, slot0, ips, got, gil, nd);
    for (int i = 0; i < got && n < nd; i++)
        if ((uintptr_t)ips[i] < self_lo || (uintptr_t)ips[i] >= self_hi)
            vals[n++] = (uint64_t)(uintptr_t)ips[i] & ~CS_FRAME_PY;
    return n;
}

static cs_stack_cache *cache_of(cs_thread *t)
{
    if (!t->cache) {
        if (!(t->cache = calloc(1, sizeof *t->cache)))
            return NULL;
        thread_stack(t->cache); /* stays 0..0 when unknown: no fast path */
        t->cache->learn_credit = LEARN_MAX;
    }
    return t->cache;
}

/* A Python-only stack (a NumPy free, with the GIL) that repeats one of
 * this thread's memos by its innermost frame: the common case, without
 * the general path's setup. NULL: take that path. */
static inline __attribute__((always_inline)) memo *python_memo(cs_thread *t, int gil)
{
    const cs_pylayout *l = cs_py.layout;
    cs_stack_cache *c = t->cache;
    const char *top;
    if (!gil || !c || !l || !(top = raw_top(l, gil)))
        return NULL;
    uint64_t h = (uint64_t)(uintptr_t)AT(top, l->f_code, const void *) ^ frame_instr(l, top);
    unsigned k = (unsigned)((h >> 1 ^ h >> 7 ^ h >> 17) % PYMEMO);
    memo *pm = &c->pymemo[k];
    const memo_frames *pfr = c->pyfr[k];
    return pm->raw && pfr && raw_same(pm, pfr, top, (int)cs_opt.python_depth, &t->py_rest) ? pm
                                                                                         : NULL;
}

static uint32_t capture_rest(cs_thread *t, int gil, int nd, int pd, unsigned site,
                             const uintptr_t *first, int levels, const uintptr_t *slot0,
                             rentry *hit);

/* A stack chain `hit` gave before, its Python frames from `top`: no
 * lookups (a loop alternating two finds each in its place: no MRU) */
static inline __attribute__((always_inline)) memo *chain_memo(cs_thread *t, rentry *hit,
                                                              const char *top, int pd)
{
    for (int k = 0; k < RMEMOS; k++)
        if (hit->memo[k].raw &&
            raw_same(&hit->memo[k], frames_of(t->cache, hit, k, 0), top, pd, &t->py_rest)) {
            t->py_walked = 1;
            hit->memo_victim = (uint8_t)(k ^ 1);
            return &hit->memo[k];
        }
    return NULL;
}

uint32_t cs_stack_capture(cs_thread *t, int gil, int python_only, unsigned site)
{
    memo *fast;
    if (python_only && cs_opt.python_depth > 0 && cs_opt.python_depth <= 128 &&
        (fast = python_memo(t, gil))) {
        t->py_walked = 1;
        return memo_use(t, fast, cs_trace_gen());
    }
    int nd = gil && python_only && cs_opt.python_depth > 0 ? 0 : (int)cs_opt.native_depth;
    int pd = (int)cs_opt.python_depth;
    if (nd > 128)
        nd = 128;
    if (pd > 128)
        pd = 128;
    if (nd <= 0 && pd <= 0)
        return 0;
    if (!cache_of(t))
        return 0;
    const uintptr_t *slot0 = NULL;
    /* how many of capsan's own frames lie above the first foreign one
     * (hooks reach emit through one to five calls): what an unwind must
     * walk on top of native_depth */
    int levels = -1;
    const uintptr_t *hint = cs_stack_hint, *first = NULL;
    cs_stack_hint = NULL;
    if (nd > 0 && t->cache->stack_hi) {
        /* a hook's own slot: above this frame, in this stack, holding a
         * return address outside capsan */
        if (hint && (uintptr_t)hint > (uintptr_t)__builtin_frame_address(0) &&
            (uintptr_t)hint + sizeof *hint <= t->cache->stack_hi &&
            (*hint < self_lo || *hint >= self_hi))
            first = hint;
        else
            first = foreign_slot(__builtin_frame_address(0), t->cache->stack_lo,
                                 t->cache->stack_hi, &levels);
    }
    if (first && (gil ? eval_hi != 0 : 1) && unw_cur_step && cs_opt.fast_unwind)
        slot0 = first;
    rentry *hit = NULL;
    if (slot0) {
        cs_stack_cache *c = t->cache;
        uint32_t g = atomic_load_explicit(&chains_gen, memory_order_relaxed);
        if (c->chain_gen != g) {
            memset(c->chain, 0, sizeof c->chain);
            c->chain_gen = g;
        }
        if (c->learn_credit < LEARN_MAX)
            c->learn_credit++;
        hit = chain_hit(c, slot0, gil);
    }
    /* a stack this chain gave before, on the innermost frame as the
     * thread state holds it: no more than that (capture_rest tries the
     * rest, and everything else). Without the GIL too: a thread that let
     * it go in C code cannot change its own frames meanwhile (an Arrow
     * stream read by duckdb with the GIL released) */
    memo *m;
    if (hit && pd > 0 && cs_py.layout && (gil || cs_py_live()) &&
        (m = chain_memo(t, hit, raw_top(cs_py.layout, gil), pd)))
        return memo_use(t, m, cs_trace_gen());
    return capture_rest(t, gil, nd, pd, site, first, levels, slot0, hit);
}

/* the stack the memos did not give: its frames walked and interned */
static __attribute__((noinline)) uint32_t capture_rest(cs_thread *t, int gil, int nd, int pd,
                                                       unsigned site, const uintptr_t *first,
                                                       int levels, const uintptr_t *slot0,
                                                       rentry *hit)
{
    uint64_t vals[MAXF + 16];
    int n = 0;
    uint32_t nhit = 0; /* the chain's frames a hit adds: copied once the memo missed */
    if (levels >= 0)
        levels++; /* counted from the caller's frame: this one lies on top */
    if (hit) {
        /* the same chain as a walk saw before, proven slot by slot */
        vals[n++] = *slot0 & ~CS_FRAME_PY;
        nhit = hit->nf < (uint32_t)nd - 1 ? hit->nf : (uint32_t)nd - 1;
        n += (int)nhit;
    } else if (nd > 0 && unw_bt) {
        if (first && levels < 0) /* the hint's: how many of capsan's frames lie above it */
            first = foreign_slot(__builtin_frame_address(0), t->cache->stack_lo,
                                 t->cache->stack_hi, &levels);
        n = walk_native(t, slot0, first, levels, gil, nd, site, vals, n);
    }
    int importing = 0, nnat = n, npy = 0;
    uint32_t gen = cs_trace_gen();
    raw_frames raw; /* only what a walk fills is read: no zeroing */
    raw.strong = 1;
    memo *pm = NULL; /* a stack of Python frames alone: its memo and frames */
    memo_frames *pfr = NULL;
    if (pd > 0 && cs_py.layout && (gil || cs_py_live())) {
        const cs_pylayout *l = cs_py.layout;
        /* the innermost frame as the thread state holds it: a memo's top
         * frame holds a code object and an instruction no shim and no frame
         * not yet started can hold, so the memos are tried on it before
         * the frames that run no code are skipped */
        const char *inner = raw_top(l, gil), *top = inner;
        for (int pass = 0; pass < 2; pass++) {
            if (hit) {
                memo *m = chain_memo(t, hit, top, pd);
                if (m)
                    return memo_use(t, m, gen);
            } else if (!nnat && top) {
                uint64_t h =
                    (uint64_t)(uintptr_t)AT(top, l->f_code, const void *) ^ frame_instr(l, top);
                unsigned k = (unsigned)((h >> 1 ^ h >> 7 ^ h >> 17) % PYMEMO);
                pm = &t->cache->pymemo[k];
                if (!(pfr = frames_at(&t->cache->pyfr[k], 1)))
                    pm = NULL;
                else if (pm->raw && raw_same(pm, pfr, top, pd, &t->py_rest)) {
                    t->py_walked = 1;
                    return memo_use(t, pm, gen);
                }
            }
            if (pass || (top = code_frame(l, inner)) == inner)
                break; /* the memos were tried on the frame that runs code */
        }
        n += npy = python_frames(t->cache, top, vals + n, pd, gil, &importing, &t->py_rest,
                                 hit || pm ? &raw : NULL);
        t->py_walked = 1;
    }
    t->importing = importing;
    if (n == 0)
        return 0;
    /* a loop repeats its stack: its id is remembered with the chain it
     * hit, or by its Python frames alone; the frames are written to the
     * trace once per file (a forked child's is another) */
    int raw_ok = raw.strong && npy > 0 && npy <= MEMO_PY && (npy == pd || !t->py_rest);
    const uint64_t *py = vals + nnat;
    if (hit)
        for (int k = 0; k < RMEMOS; k++)
            if (memo_repeats(&hit->memo[k], frames_of(t->cache, hit, k, 0), py, npy,
                             raw_ok ? &raw : NULL)) {
                hit->memo_victim = (uint8_t)(k ^ 1);
                return memo_use(t, &hit->memo[k], gen);
            }
    if (hit)
        memcpy(vals + 1, hit->fip, nhit * sizeof vals[0]);
    if (pm && memo_repeats(pm, pfr, py, npy, raw_ok ? &raw : NULL))
        return memo_use(t, pm, gen);
    uint32_t id = stack_id(t, vals, n, importing); /* its frames are in this trace now */
    memo_frames *fr;
    if (!id || npy > MEMO_PY)
        return id;
    if (hit && (fr = frames_of(t->cache, hit, hit->memo_victim, 1))) {
        memo_store(&hit->memo[hit->memo_victim], fr, id, gen, t->importing, py, npy);
        hit->memo_victim ^= 1;
    } else if (pm) {
        memo_store(pm, pfr, id, gen, t->importing, py, npy);
    }
    return id;
}

/* The interned id of a whole stack: the thread's exact cache, else the
 * tree. */
static uint32_t stack_id(cs_thread *t, const uint64_t *vals, int n, int importing)
{
    /* one multiply a frame, one full mix at the end: only picks a set, the
     * match itself is exact */
    uint64_t h = 0x12345;
    for (int i = 0; i < n; i++)
        h = (h ^ vals[i]) * 0x100000001b3ull;
    h = hmix(h, (uint64_t)n);
    if (n <= CMAXF) {
        unsigned set = (unsigned)(h % CSETS);
        for (int w = 0; w < CWAYS; w++) {
            centry *e = &t->cache->e[set][w];
            if (e->hash == h && e->n == (uint32_t)n &&
                memcmp(e->vals, vals, (size_t)n * sizeof vals[0]) == 0) {
                cs_stack_ensure(e->id);
                t->importing = e->importing;
                return e->id;
            }
        }
        uint32_t id = tree_insert(vals, n);
        centry *e = &t->cache->e[set][t->cache->victim[set]];
        t->cache->victim[set] = (uint8_t)((t->cache->victim[set] + 1) % CWAYS);
        e->hash = h;
        e->n = (uint32_t)n;
        e->id = id;
        e->importing = importing;
        memcpy(e->vals, vals, (size_t)n * sizeof vals[0]);
        return id;
    }
    return tree_insert(vals, n);
}

void cs_stack_fork_lock(int lock)
{
    if (lock)
        pthread_mutex_lock(&tree_mu);
    else
        pthread_mutex_unlock(&tree_mu);
}

/* ---- a crash: read from a signal handler, so no lock is taken, nothing
 * is allocated or interned, and every read of the program's memory is
 * probed first (a fault inside the handler would end the report) ---- */

/* n bytes at p + off into out; 0 when that memory cannot be read */
static int crash_rd(const void *p, ptrdiff_t off, void *out, size_t n)
{
    const char *a = (const char *)p + off;
    if (!p || !cs_probe_read(a, n))
        return 0;
    memcpy(out, a, n);
    return 1;
}
#define CRD(p, off, var) crash_rd((p), (off), &(var), sizeof(var))

int cs_stack_crash_native(const void *ucv, cs_crash_walk *w)
{
    /* static: the handler may run on a small alternate stack (faulthandler's) */
    static ucontext_t uc;
    static unw_cursor_t cur;
    memcpy(&uc, ucv, sizeof uc);
    greg_t *g = uc.uc_mcontext.gregs;
    int flags = 1; /* UNW_INIT_SIGNAL_FRAME: the pc is the instruction itself */
    w->n = 0;
    w->sigframe = w->eval_at = -1;
    w->in_unwinder = unw_lo < unw_hi && (uintptr_t)g[REG_RIP] >= unw_lo &&
                     (uintptr_t)g[REG_RIP] < unw_hi;
    if (g[REG_RIP] == 0) {
        /* a call through NULL: its caller's return address is on top of
         * the stack; the walk goes on from there as if 0 had returned */
        uint64_t ret;
        w->ip[w->n] = 0;
        w->exact[w->n++] = 1;
        if (!CRD((const void *)(uintptr_t)g[REG_RSP], 0, ret))
            return w->n;
        g[REG_RIP] = (greg_t)ret;
        g[REG_RSP] += 8;
        flags = 0;
    }
    /* libunwind faulting inside its own crash would end the report */
    if (!unw_cur_init2 || !unw_cur_step || !unw_cur_reg || w->in_unwinder ||
        unw_cur_init2(&cur, (unw_context_t *)&uc, flags) < 0) {
        w->ip[w->n] = (uint64_t)g[REG_RIP];
        w->exact[w->n++] = (uint8_t)flags;
        return w->n;
    }
    int exact = flags;
    do {
        unw_word_t ip = 0, sp = 0;
        if (unw_cur_reg(&cur, UNW_REG_IP, &ip) < 0 || !ip)
            break;
        /* the kernel's signal frame: a handler returns into the
         * trampoline at its start, `mov $15,%rax; syscall` (rt_sigreturn),
         * and the stack pointer there is the frame's ucontext */
        static const unsigned char sigreturn[9] = {0x48, 0xc7, 0xc0, 0x0f, 0, 0, 0, 0x0f, 0x05};
        unsigned char code[9];
        int tramp = w->n > 0 && crash_rd((const void *)ip, 0, code, sizeof code) &&
                    !memcmp(code, sigreturn, sizeof code);
        if (tramp && w->sigframe < 0 && unw_cur_reg(&cur, UNW_REG_SP, &sp) == 0)
            w->sigframe = w->n, w->sigframe_sp = sp;
        if (w->eval_at < 0 && ip > eval_lo && ip <= eval_hi)
            w->eval_at = w->n;
        w->ip[w->n] = ip;
        w->exact[w->n++] = (uint8_t)exact;
        /* after a signal frame comes the instruction it interrupted */
        exact = tramp;
    } while (w->n < CS_CRASH_FRAMES && unw_cur_step(&cur) > 0);
    return w->n;
}

/* a str's ASCII text into out, "?" when it is anything else */
static void crash_str(const void *s, char *out, size_t n)
{
    const cs_pylayout *l = cs_py.layout;
    uint32_t state = 0;
    size_t i = 0;
    if (CRD(s, l->str_state, state) && (state & STR_COMPACT_ASCII) == STR_COMPACT_ASCII) {
        const char *p = (const char *)s + l->str_data;
        for (; i + 1 < n; i++) {
            /* one probe a page */
            if ((i == 0 || ((uintptr_t)(p + i) & 4095) == 0) && !cs_probe_read(p + i, 1))
                break;
            if (!(out[i] = p[i]))
                return;
        }
    }
    if (!i)
        out[i++] = '?';
    out[i] = 0;
}

int cs_stack_crash_python(int max, void (*fn)(void *ud, const char *file, const char *name, int line),
                          void *ud)
{
    static char file[512], name[128];
    const cs_pylayout *l = cs_py.layout;
    /* this thread's state, whether or not it holds the GIL: a read of a
     * thread-specific key, as faulthandler does from its handler */
    if (!cs_py.ok || !l || !cs_py.GILState_GetThisThreadState || !cs_py_live())
        return 0;
    const char *ts = cs_py.GILState_GetThisThreadState(), *f = NULL;
    if (ts && l->ts_cframe >= 0 && !CRD(ts, l->ts_cframe, ts))
        return 0;
    if (!ts || !CRD(ts, l->cur, f))
        return 0;
    int n = 0;
    /* code_frame's rules, each read probed; a cycle ends at 100000 */
    for (int k = 0; f && k < 100000; k++) {
        const char *co = NULL, *back = NULL, *type = NULL;
        if (!CRD(f, l->f_back, back) || !CRD(f, l->f_code, co) || !co ||
            !CRD(co, sizeof(intptr_t), type))
            break;
        int lasti = -1, runs = type == cs_py.Code_Type;
        if (runs && l->model == CS_PYF_OBJECT) {
            runs = CRD(f, l->f_instr, lasti);
        } else if (runs) {
            char owner = 0;
            int first = 0;
            const char *instr = NULL;
            runs = CRD(f, l->f_owner, owner) && owner != l->owner_cstack &&
                   CRD(f, l->f_instr, instr) && CRD(co, l->co_firsttraceable, first) &&
                   (owner == l->owner_gen || instr >= co + l->co_code + 2 * first);
            if (runs)
                lasti = (int)((instr - (co + l->co_code)) / 2);
        }
        if (runs) {
            if (n < max) {
                const void *fo = NULL, *no = NULL;
                file[0] = name[0] = 0;
                crash_str(CRD(co, l->co_filename, fo) ? fo : NULL, file, sizeof file);
                crash_str(CRD(co, l->co_name, no) ? no : NULL, name, sizeof name);
                /* pure arithmetic over the code's line table (faulthandler
                 * calls it from its handler too) */
                fn(ud, file, name, cs_py.Code_Addr2Line((void *)co, lasti * 2));
            }
            n++;
        }
        f = back;
    }
    return n;
}
