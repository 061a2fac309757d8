/* Stack capture (stack.h): the entry point, and the memos that let a
 * stack seen before skip its walk.
 *
 * Hot path: a memo proven by loads alone (a chain's stack slots, the
 * Python frames' code objects and instructions), else unwind + Python
 * walk into a buffer, then an exact lookup in a per-thread set-associative
 * cache of whole stacks (a hit is the stack that happened, never a near
 * match). Misses insert into the global tree under one mutex and write the
 * new nodes to the trace (stacktree.c). */
#include "stack_int.h"

#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "options.h"
#include "tracefile.h"
#include "alloc.h"

/* a hook's own slot, for the next capture (stack.h) */
__thread const uintptr_t *cs_stack_hint __attribute__((tls_model("initial-exec")));

static int rw_kind; /* raw_walk's shape for this interpreter's frames */
static int rw_kind_of(const cs_pylayout *l);

void cs_stack_init(const void *self)
{
    if (cs_py.layout)
        rw_kind = rw_kind_of(cs_py.layout);
    unwind_init(self);
}

/* ---- the memos: a stack's id kept with what proves it again ---- */

/* A memo's frames block, made at its first use when make */
static memo_frames *frames_at(memo_frames **slot, int make)
{
    if (!*slot && make)
        *slot = cs_malloc(sizeof **slot);
    return *slot;
}

/* Chain e's memos' frames slots, RMEMOS of them */
static memo_frames **frames_slots(cs_stack_cache *c, const rentry *e)
{
    return &c->memofr[(size_t)(e - &c->chain[0][0]) * RMEMOS];
}

/* Chain e's k-th memo's frames */
static memo_frames *frames_of(cs_stack_cache *c, const rentry *e, int k, int make)
{
    return frames_at(&frames_slots(c, e)[k], make);
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
    return g != f && g && (const void *)frame_code(l, g) == co ? g : NULL;
}

/* the offsets raw_walk reads, pointer-wide: no widening in its loop */
typedef struct rw_offs {
    ptrdiff_t code, back, instr, entry, owner;
    char shim;
    int by_index;
} rw_offs;

/* frame f's raw_ip, as raw_frames records it (one shape per kind: see
 * raw_walk) */
static inline __attribute__((always_inline)) uint64_t raw_of(const cs_pylayout *l, const rw_offs *o,
                                                            const char *f, const char *back,
                                                            const int kind)
{
    uint64_t ip = o->by_index ? (uint64_t)(uint32_t)AT(f, o->instr, int)
                              : (uint64_t)(uintptr_t)AT(f, o->instr, const char *);
    /* is_entry's rules, each a constant here (the shared form cost W1
     * 90 instructions an iteration). Its field is a C bool: 0 or 1 as
     * it lies (any other byte fails the compare, as a changed frame
     * would) */
    unsigned entry = kind == RW_FIELD  ? AT(f, o->entry, unsigned char)
                     : kind == RW_SHIM ? !back || AT(back, o->owner, char) >= o->shim
                                       : (unsigned)is_entry(l, f);
    return raw_ip(ip, entry);
}

static inline __attribute__((always_inline)) int raw_walk(const cs_pylayout *l,
                                                          const memo_frames *fr, const char **fp,
                                                          int npy, const int kind)
{
    const rw_offs o = {l->f_code, l->f_back, l->f_instr, l->f_entry, l->f_owner,
                       (char)l->owner_shim, kind == RW_ANY && l->model == CS_PYF_OBJECT};
    /* RW_FIELD and RW_SHIM frames point at their instruction, inside their
     * code object's bytecode, and a raw memo holds its code objects (a
     * strong walk): the same pointer is the same code, unread. An index
     * (RW_ANY) needs the code compared first. */
    const int by_ptr = kind != RW_ANY;
    const char *f = *fp;
    const void *const *co = fr->co, *const *end = co + npy;
    const uint64_t *want = fr->ip;
    for (; co != end; co++, want++) {
        if (!f)
            return 0;
        const char *back = AT(f, o.back, const char *);
        if (by_ptr && __builtin_expect(raw_of(l, &o, f, back, kind) == *want, 1)) {
            f = back;
            continue;
        }
        /* a shim or a frame not yet started may lie between: the frame
         * that runs the memo's code is the next one that runs code */
        if ((const void *)frame_code(l, f) != *co) {
            if (!(f = code_frame_holding(l, f, *co)))
                return 0;
            back = AT(f, o.back, const char *);
        } else if (by_ptr) {
            return 0; /* its own code at another instruction */
        }
        if (raw_of(l, &o, f, back, kind) != *want)
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
    if (l->model != CS_PYF_OBJECT && l->owner_shim >= 0 && l->f_owner >= 0)
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

/* ---- the capture ---- */

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
    uint64_t h = (uint64_t)(uintptr_t)frame_code(l, top) ^ frame_instr(l, top);
    unsigned k = (unsigned)((h >> 1 ^ h >> 7 ^ h >> 17) % PYMEMO);
    memo *pm = &c->pymemo[k];
    const memo_frames *pfr = c->pyfr[k];
    return pm->raw && pfr && raw_same(pm, pfr, top, (int)cs_opt.python_depth, &t->py_rest) ? pm
                                                                                         : NULL;
}

static uint32_t capture_rest(cs_thread *t, int gil, int nd, int pd, unsigned site,
                             const uintptr_t *first, int levels, const uintptr_t *slot0,
                             rentry *hit);

/* The second memo has hit this many times in a row: the first is stale
 * (a stack of the program's set-up, say), and every capture paid to find
 * that out first (about 70 instructions: its top frame runs other code,
 * so the frames below are searched for a shim). Swapped, the live one is
 * tried first. */
#define MEMO_STALE 8

static __attribute__((noinline)) void memo_swap(cs_stack_cache *c, rentry *e)
{
    memo m = e->memo[0];
    e->memo[0] = e->memo[1];
    e->memo[1] = m;
    memo_frames **fr = frames_slots(c, e), *f = fr[0];
    fr[0] = fr[1];
    fr[1] = f;
    e->memo_victim = 1; /* the stale one */
    e->memo_streak = 0;
}

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
            if (!k) {
                hit->memo_streak = 0;
            } else if (++hit->memo_streak >= MEMO_STALE) {
                memo_swap(t->cache, hit);
                return &hit->memo[0];
            }
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
                    (uint64_t)(uintptr_t)frame_code(l, top) ^ frame_instr(l, top);
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
