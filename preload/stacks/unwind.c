/* Native frames (stack.h): libunwind, loaded privately, and the chain
 * cache that spares most captures its walk. A hook's caller heads a chain
 * of native frames up to the eval loop; once learnt (libunwind's cursor
 * walk, which says where each return address is stored) the same chain is
 * proven again by a few loads of those stack slots. What no chain gives,
 * libunwind walks. */
#include "stack_int.h"

#include <dlfcn.h>
#include <link.h>

#include "libpath.h"

/* ---- native: libunwind, loaded RTLD_LOCAL so its _Unwind_* and backtrace
 * never replace libgcc's for the host (C++ exceptions in torch) ---- */
int (*unw_bt)(void **, int);
static int (*unw_policy)(void *, int);
static void (*unw_flush)(void *, uintptr_t, uintptr_t);
static void *unw_space;
/* libunwind's cursor API, for a walk that also says where each return
 * address is stored (a chain-cache miss) */
static int (*unw_ctx_get)(unw_context_t *);
static int (*unw_cur_init)(unw_cursor_t *, unw_context_t *);
int (*unw_cur_step)(unw_cursor_t *);
int (*unw_cur_reg)(unw_cursor_t *, unw_regnum_t, unw_word_t *);
/* for a crash: a walk from the signal's own context */
int (*unw_cur_init2)(unw_cursor_t *, unw_context_t *, int);
uintptr_t self_lo, self_hi;
uintptr_t unw_lo, unw_hi; /* libunwind's code */
uintptr_t eval_lo, eval_hi; /* _PyEval_EvalFrameDefault */

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

void unwind_init(const void *self)
{
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

_Atomic uint32_t chains_gen;

void cs_stack_flush(void)
{
    /* the chain caches hold return addresses into what was unloaded */
    atomic_fetch_add(&chains_gen, 1);
    /* libunwind keys its cache by address: unloaded objects leave stale
     * entries; dropping all of it is cheap and rare */
    if (unw_flush && unw_space)
        unw_flush(unw_space, 0, 0);
}

/* ---- the chain cache: a hit proven slot by slot, a miss walked ---- */

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

rentry *chain_hit(cs_stack_cache *c, const uintptr_t *slot0, int gil)
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
__attribute__((noinline)) int walk_native(cs_thread *t, const uintptr_t *slot0,
                                          const uintptr_t *first, int levels, int gil, int nd,
                                          unsigned site, uint64_t *vals, int n)
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
