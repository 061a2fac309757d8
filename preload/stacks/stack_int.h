/* What the files of stacks/ share, private to them: the per-thread cache
 * (each part of a capture keeps its memos in it), the frame reads the hot
 * path inlines, and the functions one file calls in another. The calls run
 * one way: stack.c (the capture and its memos) calls unwind.c, pyframes.c,
 * stacktree.c and threadcache.c; pyframes.c and stacktree.c call pycode.c;
 * importing.c calls threadcache.c; crashwalk.c reads what unwind.c
 * loaded. */
#ifndef CAPSAN_STACK_INT_H
#define CAPSAN_STACK_INT_H

#include <libunwind.h> /* types only: the functions come from dlsym */
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "pyapi.h"
#include "stack.h"

#define MAXF 256

/* Code objects and frames are read at the offsets of the running version
 * (pyversions.inc): the runtime is built without Python headers. */
typedef struct code_obj code_obj; /* a PyCodeObject, opaque */

#define AT(p, off, type) (*(type const *)((const char *)(p) + (off)))

/* a frame's code object (f_executable untagged: a _PyStackRef in 3.14+) */
#define frame_code(l, f) cs_frame_code((l), (const char *)(f))

/* an object's type, at the build's object head (24 on free-threaded) */
#define obj_type(l, o) AT((o), (l)->ob_type, const void *)

/* The bytecode a frame's instruction pointer points into: its code
 * object's, or on free-threaded 3.14+ the thread's own copy of it
 * (co_tlbc->entries[tlbc_index], a _PyCodeArray: size, then entries) */
static inline const char *frame_bytecode(const cs_pylayout *l, const char *f, const char *co)
{
    if (l->co_tlbc < 0)
        return co + l->co_code;
    const char *arr = AT(co, l->co_tlbc, const char *);
    int idx = AT(f, l->f_tlbc, int);
    if (!arr || idx < 0 || idx >= AT(arr, 0, intptr_t))
        return co + l->co_code;
    return AT(arr, 8 + 8 * idx, const char *);
}

/* PyASCIIObject.state's compact and ascii bits (3.10-3.13) */
#define STR_COMPACT_ASCII ((1u << 5) | (1u << 6))

/* a compact ASCII str's text, read in place (no call, no GIL), or NULL */
static inline const char *ascii_in_place(const void *s)
{
    const cs_pylayout *l = cs_py.layout;
    if (!s)
        return NULL;
    uint32_t state = AT(s, l->str_state, uint32_t);
    return (state & STR_COMPACT_ASCII) == STR_COMPACT_ASCII ? (const char *)s + l->str_data : NULL;
}

/* a code object's id (pycode.c): its names, and what frames read of it */
typedef struct code_info {
    const char *file, *name;
    uint32_t firstlineno;
    int importlib; /* the import machinery itself: frames below run an import */
    int weak;      /* no reference held: check against (fobj, nobj) first */
    const void *fobj, *nobj;
    _Atomic uint32_t gen;  /* trace generation it was written in */
} code_info;

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
    uint8_t memo_streak; /* hits in a row on the second memo (chain_memo) */
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
    int strong; /* its code objects are interned (held): no names compared */
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

/* What python_frames saw, for a memo (memo_frames.co, .ip): valid when
 * every frame's code object is one capsan holds */
typedef struct raw_frames {
    int strong;
    const void *co[MEMO_PY];
    uint64_t ip[MEMO_PY];
} raw_frames;

/* a 64-bit mix: picks a place in the tree's map, the exact cache, the missed chains */
static inline uint64_t hmix(uint64_t a, uint64_t b)
{
    uint64_t h = a * 0x9e3779b97f4a7c15ull ^ b;
    h ^= h >> 31;
    h *= 0xbf58476d1ce4e5b9ull;
    return h ^ (h >> 29);
}

/* ---- unwind.c: libunwind, loaded privately, and the native frames ---- */
extern int (*unw_bt)(void **, int);
extern int (*unw_cur_step)(unw_cursor_t *);
extern int (*unw_cur_reg)(unw_cursor_t *, unw_regnum_t, unw_word_t *);
extern int (*unw_cur_init2)(unw_cursor_t *, unw_context_t *, int);
extern uintptr_t self_lo, self_hi; /* libcapsan.so's code */
extern uintptr_t unw_lo, unw_hi; /* libunwind's code */
extern uintptr_t eval_lo, eval_hi; /* _PyEval_EvalFrameDefault */
extern _Atomic uint32_t chains_gen; /* bumped when an object is unloaded */
/* cs_stack_init's native part: libcapsan.so's code, the eval loop's, libunwind */
void unwind_init(const void *self);
/* the learnt chain whose stack slots from slot0 hold its return addresses */
rentry *chain_hit(cs_stack_cache *c, const uintptr_t *slot0, int gil);
/* no chain hit: the native frames unwound, appended to vals[n..] */
int walk_native(cs_thread *t, const uintptr_t *slot0, const uintptr_t *first, int levels, int gil,
                int nd, unsigned site, uint64_t *vals, int n);

/* The stack slot holding the first return address outside capsan: capsan
 * is built with frame pointers, so its own frames chain through rbp up to
 * the hook that foreign code called. */
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

/* ---- threadcache.c ---- */
/* the thread's cache, made at its first use (NULL: no memory) */
cs_stack_cache *cache_of(cs_thread *t);

/* ---- pycode.c: code objects interned ---- */
code_info *code_at(uint32_t id);
/* id's names to this trace, once per file */
void code_write(uint32_t id);
/* co's id (0: none; without the GIL, a weak entry or none) */
uint32_t code_id(code_obj *co, int gil);

/* ---- pyframes.c: the interpreter's frames ---- */
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

/* A frame's instruction as one number: f_lasti (3.10) or the pointer to
 * the instruction (3.11+) */
static inline uint64_t frame_instr(const cs_pylayout *l, const char *f)
{
    return l->model == CS_PYF_OBJECT ? (uint64_t)(uint32_t)AT(f, l->f_instr, int)
                                     : (uint64_t)(uintptr_t)AT(f, l->f_instr, const char *);
}

/* A frame's instruction with its entry flag, as a memo keeps it */
static inline uint64_t raw_ip(uint64_t instr, unsigned entry)
{
    return instr << 1 | entry;
}

/* the next frame from f that runs code (f itself if it does), or NULL */
const char *code_frame(const cs_pylayout *l, const char *f);
/* f is the outermost frame of its C-level evaluation */
int is_entry(const cs_pylayout *l, const char *f);
/* a capture's Python frames from f, up to max, into out */
int python_frames(cs_stack_cache *c, const char *f, uint64_t *out, int max, int gil,
                  int *importing, const char **rest, raw_frames *raw);

/* ---- stacktree.c: stacks interned ---- */
/* the id of a whole stack, its frames in this trace */
uint32_t stack_id(cs_thread *t, const uint64_t *vals, int n, int importing);

#endif
