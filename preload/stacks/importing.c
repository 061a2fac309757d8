/* Is this thread running an import (stack.h's cs_stack_importing)? An
 * importlib frame below the Python frames its last capture recorded. */
#include "stack_int.h"

#include <string.h>

/* Does an import machinery frame lie at f or below it? Only the file name
 * is read, in place, so nothing is interned. The thread's answers are kept
 * with the chains they walked (imemo): the same frames again need only
 * loads and compares, no names. */

/* m holds the chain from f as it is now: its verdict, or -1 */
static inline int imemo_verdict(const cs_pylayout *l, const char *f, const imemo *m)
{
    const ptrdiff_t o_back = l->f_back, o_file = l->co_filename;
    const int n = m->n;
    if (!n || f != m->f0)
        return -1;
    int i = 0;
    const char *g = f;
    if (m->strong) {
        /* its code objects are interned for good (held): the same address
         * is the same code, and so the same file */
        for (; g && i < n; i++, g = AT(g, o_back, const char *))
            if (frame_code(l, g) != m->fr[i].co)
                return -1;
        return i == n && !g ? m->verdict : -1;
    }
    for (; g && i < n; i++, g = AT(g, o_back, const char *)) {
        const char *co = frame_code(l, g);
        if (co != m->fr[i].co || (m->fr[i].fn && AT(co, o_file, const void *) != m->fr[i].fn))
            return -1;
    }
    return i == n && !g ? m->verdict : -1;
}

/* Whether an importlib frame lies in the chain from f: walked, and the
 * chain kept in m (if any) for imemo_verdict. With the GIL, the chain's
 * code objects are interned (pycode.c: held for good), and the memo is
 * proven by their addresses alone: a deep stack's allocations (pytest's)
 * prove 20 frames or more beyond the ones their stack keeps, each time */
static int import_below(const cs_pylayout *l, const char *f, imemo *m, int gil)
{
    const char *f0 = f;
    int verdict = 0, i, strong = gil && m;
    for (i = 0; f && i < 1024; i++, f = AT(f, l->f_back, const char *)) {
        const char *co = frame_code(l, f);
        const void *fn = NULL;
        /* a shim's or 3.13's non-code executable is no import */
        if (co && obj_type(l, co) == cs_py.Code_Type) {
            fn = AT(co, l->co_filename, const void *);
            const char *file = ascii_in_place(fn);
            if (file && file[0] == '<' && strncmp(file, "<frozen importlib", 17) == 0)
                verdict = 1;
            if (strong && i < IMEMO && !code_id((code_obj *)(uintptr_t)co, 1))
                strong = 0; /* out of memory: names compared */
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
        m->strong = strong;
    }
    return verdict;
}

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
        return import_below(l, f, NULL, 0);
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
    return import_below(l, f, &set[w], gil);
}

