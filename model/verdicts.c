/* Leak verdicts: what is still alive when a process ends (exit, _exit,
 * killed), when an API scope ends, or when a handler's blocks are judged,
 * and what only a leak keeps alive (its indirect part). */
#include "lifecycle.h"
#include "protocol.h"

#include <stdlib.h>
#include <string.h>

#include "alloc.h"
#include "sort.h"

typedef struct live_report {
    uint64_t origin_c, since_ns;
    int n;
    const uint64_t *held; /* sorted: not judged */
    size_t nheld;
} live_report;

/* a live object made by the scope's handler since its start, and judged
 * by its end (a handler serves one scope after another: the pytest plugin
 * keeps one while no array or context holds it) */
static int from_scope(const obj *o, uint64_t origin_c, uint64_t since_ns)
{
    if (!o->nhist || o->hist[0].c != origin_c || o->hist[0].time_ns < since_ns)
        return 0;
    /* module data made by an import inside the scope (numpy 2 imports
     * numpy.random at first use): as at exit, not a leak */
    return !(o->ns == CS_NS_NUMPY && (o->hist[0].flags & CS_EVF_IMPORT));
}

static void report_if_from(cs_lifecycle *lc, obj *o, void *ud)
{
    live_report *r = ud;
    if (!from_scope(o, r->origin_c, r->since_ns) ||
        (r->nheld && bsearch(&o->key, r->held, r->nheld, sizeof *r->held, ot_cmp_u64)))
        return;
    o->flags |= OF_LEAK_REPORTED;
    ot_report(lc, NULL, o->ns == CS_NS_NUMPY ? CS_KIND_NUMPY_LEAK : CS_KIND_DLPACK_LEAK, o, NULL, 0,
           0);
    r->n++;
}

int cs_lc_report_live(cs_lifecycle *lc, int ns, uint64_t origin_c, uint64_t since_ns,
                      const uint64_t *held, size_t nheld)
{
    live_report r = {.origin_c = origin_c, .since_ns = since_ns, .held = held,
                     .nheld = held ? nheld : 0};
    ot_each_live(lc, ns, report_if_from, &r);
    return r.n;
}

static int keep_from(const obj *o, void *ud)
{
    const uint64_t *c_since = ud;
    return from_scope(o, c_since[0], c_since[1]);
}

size_t cs_lc_live_from(cs_lifecycle *lc, int ns, uint64_t origin_c, uint64_t since_ns,
                       uint64_t **out)
{
    uint64_t c_since[2] = {origin_c, since_ns};
    return ot_live_keys(lc, ns, keep_from, c_since, out);
}

/* still alive at a normal exit, and nothing says it was meant to be */
static int leaked_at_exit(cs_lifecycle *lc, const obj *o)
{
    if (!o->key || o->state == CS_ST_RELEASED ||
        (o->flags & (OF_LEAK_REPORTED | OF_NULL_DELETER | OF_REACHABLE | OF_VIEW)))
        return 0; /* reachable: LeakSanitizer's "still reachable" */
    if (o->ns == CS_NS_NUMPY && ot_kept_at_shutdown(lc, o->key, ot_block_end(o)))
        return 0; /* referenced by a consumer alive at shutdown */
    if (o->ns == CS_NS_DLPACK && o->state == CS_ST_CONSUMED && o->data &&
        ot_kept_at_shutdown(lc, o->data, o->data + 1))
        return 0; /* consumed by an array numpy kept alive through shutdown on
                   * purpose (its deleter ran after Python was gone): the same
                   * data, referenced at shutdown, not leaked */
    if (o->ns == CS_NS_NUMPY && o->nhist && (o->hist[0].flags & CS_EVF_IMPORT))
        return 0; /* module data, made by an import: referenced at shutdown */
    return 1;
}

static int judged_at_exit(const obj *o, void *ud) { return leaked_at_exit(ud, o); }

int cs_lc_block_kept_at_shutdown(cs_lifecycle *lc, uint64_t key)
{
    stripe *st = ot_stripe_of(lc, key);
    ot_lock(lc, st);
    obj *o = ot_find(st, key, CS_NS_NUMPY);
    uint64_t end = o ? ot_block_end(o) : 0;
    ot_unlock(lc, st);
    return o && ot_kept_at_shutdown(lc, key, end);
}

size_t cs_lc_exit_candidates(cs_lifecycle *lc, int ns, uint64_t **out)
{
    return ot_live_keys(lc, ns, judged_at_exit, lc, out);
}

/* released by a consumer that never renamed its capsule, which is still
 * alive at exit: its destructor will delete again at shutdown (R8) */
static int unrenamed_at_exit(const obj *o)
{
    return o->key && o->ns == CS_NS_DLPACK && o->state == CS_ST_RELEASED &&
           (o->flags & OF_UNRENAMED) && !(o->flags & OF_CAPSULE_DEAD);
}

/* exported, never consumed, and dropped at shutdown (CS_EV_DROPPED) */
static int dropped_at_exit(const obj *o)
{
    return o->key && o->ns == CS_NS_DLPACK && (o->flags & OF_DROPPED) &&
           !(o->flags & OF_LEAK_REPORTED);
}

/* a live block only a shutdown deleter kept: no leak of its own, but the
 * indirect part of a dropped tensor whose data it holds */
static int kept_block(cs_lifecycle *lc, const obj *o)
{
    if (!o->key || o->ns != CS_NS_NUMPY || o->state != CS_ST_CREATED ||
        (o->flags & OF_LEAK_REPORTED))
        return 0;
    /* reached from Python at atexit and alive after finalization: held,
     * unless a leaked tensor's data lies in it (the array its manager_ctx
     * keeps is what kept it through finalization) */
    if ((o->flags & (OF_REACHABLE | OF_PY_HELD)) == (OF_REACHABLE | OF_PY_HELD))
        return 1;
    return !(o->flags & OF_REACHABLE) && ot_kept_at_shutdown(lc, o->key, ot_block_end(o));
}

typedef struct leak_ref {
    uint64_t time, key;
    uint64_t lo, hi;  /* NumPy: the block; DLPack: the data it lends, if known */
    int ns;
    int what;         /* 0 a leak, 1 unrenamed, 2 only if it is someone's indirect,
                       * 3 live at _exit (reachable) unless it is someone's indirect */
    long root;        /* NumPy: the leaked tensor whose data lies in it, or -1 */
} leak_ref;

static int cmp_leak(const void *a, const void *b)
{
    const leak_ref *x = a, *y = b;
    if (x->time != y->time)
        return (x->time > y->time) - (x->time < y->time);
    if (x->ns != y->ns)
        return x->ns - y->ns;
    return (x->key > y->key) - (x->key < y->key);
}

static int cmp_root(const void *a, const void *b)
{
    const leak_ref *const *x = a, *const *y = b;
    return ((*x)->lo > (*y)->lo) - ((*x)->lo < (*y)->lo);
}

/* a leak that can hold NumPy blocks: a tensor, or an Arrow stream whose
 * batches' data was seen (lo) */
static int may_hold(const leak_ref *x)
{
    return (x->ns == CS_NS_DLPACK || x->ns == CS_NS_ARROW) && x->what == 0 && x->lo;
}

/* Each NumPy block that a leaked tensor's data lies in is that tensor's
 * indirect leak (a consumer that never deleted a numpy export leaks the
 * struct and, through manager_ctx, the array): v[i].root = the tensor.
 * So is a block an unreleased Arrow stream's batches were read from (a
 * producer that shares an array zero-copy keeps it for the stream). */
static void link_indirect(leak_ref *v, size_t nv)
{
    size_t nr = 0;
    for (size_t i = 0; i < nv; i++)
        nr += may_hold(&v[i]);
    leak_ref **r = nr ? cs_malloc(nr * sizeof *r) : NULL;
    if (!r)
        return;
    nr = 0;
    for (size_t i = 0; i < nv; i++)
        if (may_hold(&v[i]))
            r[nr++] = &v[i];
    cs_sort(r, nr, sizeof *r, cmp_root);
    for (size_t i = 0; i < nv; i++) {
        if (v[i].ns != CS_NS_NUMPY)
            continue;
        size_t lo = 0, hi = nr; /* the first root whose data is >= the block */
        while (lo < hi) {
            size_t mid = lo + (hi - lo) / 2;
            if (r[mid]->lo < v[i].lo)
                lo = mid + 1;
            else
                hi = mid;
        }
        if (lo < nr && r[lo]->lo < v[i].hi)
            v[i].root = r[lo] - v;
    }
    cs_free(r);
}

/* A tensor's dlpack-leak, with what only it keeps alive (ind) */
static void report_tensor_leak(cs_lifecycle *lc, obj *o, uint32_t detail, const cs_finding *ind)
{
    lc->indirect = ind->nindirect ? ind : NULL;
    ot_report(lc, NULL, CS_KIND_DLPACK_LEAK, o, NULL, detail, 0);
    lc->indirect = NULL;
}

/* The indirect part of root v[ri]: each block is traced (its history goes
 * to the sink, so a replay links it the same way) and not reported again. */
static void gather_indirect(cs_lifecycle *lc, leak_ref *v, size_t nv, size_t ri, cs_finding *ind)
{
    memset(ind, 0, sizeof *ind);
    for (size_t i = 0; i < nv; i++) {
        if (v[i].root != (long)ri)
            continue;
        stripe *st = ot_stripe_of(lc, v[i].key);
        ot_lock(lc, st);
        obj *o = ot_find(st, v[i].key, v[i].ns);
        if (o && o->state == CS_ST_CREATED && !(o->flags & OF_LEAK_REPORTED)) {
            o->flags |= OF_LEAK_REPORTED;
            ot_trace(lc, o);
            if (ind->nindirect < CS_FINDING_MAX_INDIRECT)
                ind->indirect[ind->nindirect] = (cs_indirect){
                    .kind = CS_KIND_NUMPY_LEAK, .obj = o->key, .bytes = o->bytes,
                    .alloc = o->nhist ? o->hist[0] : (cs_event){0}};
            ind->nindirect++;
            ind->indirect_bytes += o->bytes;
        }
        ot_unlock(lc, st);
    }
}

/* at _exit: what is still alive and was made by the program (not by an
 * import: module data), or released by nobody who could */
static int live_at_quick_exit(const obj *o)
{
    return o->key && (o->state == CS_ST_CREATED || o->state == CS_ST_CONSUMED) &&
           !(o->flags & (OF_LEAK_REPORTED | OF_NULL_DELETER | OF_VIEW)) &&
           !(o->ns == CS_NS_NUMPY && o->nhist && (o->hist[0].flags & CS_EVF_IMPORT));
}

static int judged_at_quick_exit(const obj *o, void *ud)
{
    const cs_lifecycle *lc = ud;
    /* not one inherited from the parent this process forked from */
    return live_at_quick_exit(o) && !(o->nhist && o->hist[0].time_ns < lc->born_ns);
}

size_t cs_lc_quick_exit_candidates(cs_lifecycle *lc, int ns, uint64_t **out)
{
    return ot_live_keys(lc, ns, judged_at_quick_exit, lc, out);
}

static int what_at_end(cs_lifecycle *lc, const obj *o, int how)
{
    if (how == CS_END_QUICK_EXIT) {
        if (!judged_at_quick_exit(o, lc))
            return -1;
        /* an Arrow struct still in its capsule: the capsule, a Python
         * object, is alive, and _exit runs no destructor (a forked
         * multiprocessing worker ends so) */
        if (o->ns == CS_NS_ARROW && o->state == CS_ST_CREATED && !(o->flags & OF_CAPSULE_DEAD))
            return 3;
        return (o->flags & OF_REACHABLE) ? 3 : 0;
    }
    return leaked_at_exit(lc, o) || dropped_at_exit(o) ? 0
         : unrenamed_at_exit(o)                       ? 1
         : kept_block(lc, o)                          ? 2
                                                      : -1;
}

/* Leaks are reported in the order their objects were made, whatever table
 * slot or stripe they sit in. */
int cs_lc_finish(cs_lifecycle *lc, int how)
{
    if (how != CS_END_EXIT && how != CS_END_QUICK_EXIT)
        return 0;
    leak_ref *v = NULL;
    size_t nv = 0, cap = 0;
    for (int i = 0; i < NSTRIPES; i++) {
        stripe *st = &lc->s[i];
        ot_lock(lc, st);
        for (size_t j = 0; j < st->cap; j++) {
            obj *o = &st->tab[j];
            int what = what_at_end(lc, o, how);
            if (what < 0)
                continue;
            if (!ot_room_for_one(&v, nv, &cap, sizeof *v))
                break;
            leak_ref r = {o->nhist ? o->hist[0].time_ns : 0, o->key, 0, 0, o->ns, what, -1};
            if (o->ns == CS_NS_NUMPY) {
                r.lo = o->key;
                r.hi = o->key + (o->bytes ? o->bytes : 1);
            } else {
                r.lo = o->data;
            }
            v[nv++] = r;
        }
        ot_unlock(lc, st);
    }
    if (nv)
        cs_sort(v, nv, sizeof *v, cmp_leak);
    link_indirect(v, nv);
    int n = 0;
    for (size_t i = 0; i < nv; i++) {
        if (v[i].root >= 0 || v[i].what == 2)
            continue; /* someone's indirect part, or no leak of its own */
        cs_finding ind;
        memset(&ind, 0, sizeof ind);
        if ((v[i].ns == CS_NS_DLPACK || v[i].ns == CS_NS_ARROW) && v[i].what == 0)
            gather_indirect(lc, v, nv, i, &ind);
        stripe *st = ot_stripe_of(lc, v[i].key);
        ot_lock(lc, st);
        obj *o = ot_find(st, v[i].key, v[i].ns);
        int what = o ? what_at_end(lc, o, how) : -1;
        if (what == 3) {
            o->flags |= OF_LEAK_REPORTED;
            ot_report(lc, NULL, CS_KIND_LIVE_AT_EXIT, o, NULL, 0, 0);
            n++;
        } else if (what == 1) {
            cs_dl_not_renamed(lc, st, o, NULL, NULL);
            n++;
        } else if (what == 0) {
            o->flags |= OF_LEAK_REPORTED;
            if (o->ns == CS_NS_NUMPY) {
                ot_report(lc, NULL, CS_KIND_NUMPY_LEAK, o, NULL, 0, 0);
            } else if (o->ns == CS_NS_ARROW) {
                /* moved out (or a stream's result) and never released, or
                 * its capsule never died */
                lc->indirect = ind.nindirect ? &ind : NULL;
                ot_report(lc, NULL, CS_KIND_ARROW_LEAK, o, NULL,
                          o->state == CS_ST_CONSUMED ? CS_LEAK_CONSUMED : CS_LEAK_NEVER_CONSUMED, 0);
                lc->indirect = NULL;
            } else {
                report_tensor_leak(lc, o,
                                   (o->flags & OF_DROPPED)        ? CS_LEAK_SHUTDOWN
                                   : o->state == CS_ST_CONSUMED ? CS_LEAK_CONSUMED
                                                                : CS_LEAK_NEVER_CONSUMED,
                                   &ind);
            }
            n++;
        }
        ot_unlock(lc, st);
    }
    cs_free(v);
    return n;
}

/* ---- a process killed without a leak verdict ---- */

static int cmp_slot(const void *a, const void *b)
{
    const cs_live_slot *x = a, *y = b;
    if (x->time_ns != y->time_ns)
        return (x->time_ns > y->time_ns) - (x->time_ns < y->time_ns);
    return (x->obj > y->obj) - (x->obj < y->obj);
}

int cs_lc_finish_killed(cs_lifecycle *lc, const cs_live_slot *slots, size_t n)
{
    cs_live_slot *v = n ? cs_malloc(n * sizeof *v) : NULL;
    if (!v)
        return 0;
    memcpy(v, slots, n * sizeof *v);
    cs_sort(v, n, sizeof *v, cmp_slot); /* in the order they were made */
    int nrep = 0;
    for (size_t i = 0; i < n; i++) {
        const cs_live_slot *s = &v[i];
        int ns = s->kind == CS_EV_NP_ALLOC     ? CS_NS_NUMPY
                 : s->kind == CS_EV_AR_EXPORT ? CS_NS_ARROW
                                              : CS_NS_DLPACK;
        if (!s->obj || (s->flags & CS_EVF_NULL_DELETER) ||
            (ns == CS_NS_NUMPY && (s->flags & CS_EVF_IMPORT)) || s->time_ns < lc->born_ns)
            continue; /* nobody can release it, module data, or the parent's */
        int kind = ns == CS_NS_NUMPY   ? CS_KIND_LIVE_AT_EXIT
                   : ns == CS_NS_ARROW ? CS_KIND_ARROW_LEAK
                                       : CS_KIND_DLPACK_LEAK;
        uint32_t detail = ns == CS_NS_NUMPY ? CS_LIVE_KILLED : CS_LEAK_KILLED;
        stripe *st = ot_stripe_of(lc, s->obj);
        ot_lock(lc, st);
        obj *o = ot_find(st, s->obj, ns);
        if (o && o->nhist) {
            /* its history is in the trace (it has findings): judged by it */
            if (o->state != CS_ST_RELEASED && !(o->flags & OF_LEAK_REPORTED)) {
                o->flags |= OF_LEAK_REPORTED;
                ot_report(lc, NULL, kind, o, NULL, detail, 0);
                nrep++;
            }
        } else {
            /* known only from its slot: its making (and consume) events */
            cs_event h[2] = {{.kind = s->kind, .aux = s->aux, .flags = s->flags,
                              .thread = s->thread, .time_ns = s->time_ns, .obj = s->obj,
                              .stack = s->stack}};
            if (ns == CS_NS_NUMPY)
                h[0].a = s->bytes;
            else
                h[0].c = s->bytes;
            uint8_t nh = 1;
            if (s->consume_stack)
                h[nh++] = (cs_event){.kind = CS_EV_CONSUME, .obj = s->obj, .thread = s->thread,
                                     .time_ns = s->time_ns, .stack = s->consume_stack};
            obj tmp = {.key = s->obj, .ns = (uint8_t)ns, .bytes = s->bytes, .hist = h, .nhist = nh};
            ot_report(lc, NULL, kind, &tmp, NULL, detail, 0);
            nrep++;
        }
        ot_unlock(lc, st);
    }
    cs_free(v);
    return nrep;
}

/* ---- a scope's end (API mode) ---- */

static uint64_t consumed_at(const obj *o)
{
    if (o->flags & OF_XAPI)
        return o->nhist ? o->hist[0].time_ns : 0; /* owned from its birth */
    for (unsigned i = 0; i < o->nhist; i++)
        if (o->hist[i].kind == CS_EV_CONSUME)
            return o->hist[i].time_ns;
    return 0;
}

typedef struct since_list {
    uint64_t since_ns;
    int (*keep)(const obj *o, uint64_t since_ns);
    uint64_t *v;
    size_t n, cap;
} since_list;

static void keep_since(cs_lifecycle *lc, obj *o, void *ud)
{
    (void)lc;
    since_list *l = ud;
    if (o->state == CS_ST_CONSUMED && l->keep(o, l->since_ns) &&
        ot_room_for_one(&l->v, l->n, &l->cap, sizeof *l->v))
        l->v[l->n++] = o->key;
}

size_t ot_owned_since(cs_lifecycle *lc, int ns, int (*keep)(const obj *o, uint64_t since_ns),
                      uint64_t since_ns, uint64_t **out)
{
    since_list l = {since_ns, keep, NULL, 0, 0};
    ot_each_live(lc, ns, keep_since, &l);
    if (l.n)
        cs_sort(l.v, l.n, sizeof *l.v, ot_cmp_u64);
    *out = l.v;
    return l.n;
}

static int consumed_since(const obj *o, uint64_t since_ns)
{
    return !(o->flags & (OF_NULL_DELETER | OF_VIEW)) && consumed_at(o) >= since_ns;
}

size_t cs_lc_consumed_since(cs_lifecycle *lc, uint64_t since_ns, uint64_t **out)
{
    return ot_owned_since(lc, CS_NS_DLPACK, consumed_since, since_ns, out);
}

int cs_lc_report_dlpack_leak(cs_lifecycle *lc, uint64_t key)
{
    stripe *st = ot_stripe_of(lc, key);
    ot_lock(lc, st);
    obj *o = ot_find(st, key, CS_NS_DLPACK);
    int live = o && o->state == CS_ST_CONSUMED && !(o->flags & OF_LEAK_REPORTED);
    uint64_t data = live ? o->data : 0;
    ot_unlock(lc, st);
    if (!live)
        return 0;
    /* its buffer: the live NumPy blocks its data lies in */
    leak_ref *v = NULL;
    size_t nv = 0, cap = 0;
    if (ot_room_for_one(&v, nv, &cap, sizeof *v))
        v[nv++] = (leak_ref){0, key, data, 0, CS_NS_DLPACK, 0, -1};
    for (int i = 0; data && v && i < NSTRIPES; i++) {
        stripe *s2 = &lc->s[i];
        ot_lock(lc, s2);
        for (size_t k = 0; k < s2->cap; k++) {
            obj *b = &s2->tab[k];
            if (b->key && b->ns == CS_NS_NUMPY && b->state == CS_ST_CREATED &&
                !(b->flags & OF_LEAK_REPORTED) && b->key <= data &&
                data < b->key + (b->bytes ? b->bytes : 1) &&
                ot_room_for_one(&v, nv, &cap, sizeof *v))
                v[nv++] = (leak_ref){0, b->key, b->key, b->key + b->bytes, CS_NS_NUMPY, 0, 0};
        }
        ot_unlock(lc, s2);
    }
    cs_finding ind;
    if (v)
        gather_indirect(lc, v, nv, 0, &ind);
    else
        memset(&ind, 0, sizeof ind);
    cs_free(v);
    ot_lock(lc, st);
    o = ot_find(st, key, CS_NS_DLPACK);
    int n = 0;
    if (o && o->state == CS_ST_CONSUMED && !(o->flags & OF_LEAK_REPORTED)) {
        o->flags |= OF_LEAK_REPORTED;
        report_tensor_leak(lc, o, CS_LEAK_CONSUMED, &ind);
        n = 1;
    }
    ot_unlock(lc, st);
    return n;
}
