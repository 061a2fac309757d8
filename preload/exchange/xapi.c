/* DLPack 1.3's exchange API (see xapi.h). */
#include "xapi.h"

#include <dlfcn.h>
#include <stdatomic.h>
#include <stddef.h>
#include <string.h>

#include "deleter.h"
#include "probe.h"
#include "pyapi.h"
#include "runtime.h"
#include "seenset.h"
#include "spin.h"
#include "stack.h"
#include "xffi.h"
#include "xview.h"
#include "young.h"

/* DLPackExchangeAPI, x86-64 (dlpack.h 1.3): header, then five entries */
typedef void (*set_error_fn)(void *ctx, const char *kind, const char *msg);
typedef struct xtable {
    uint32_t major, minor;
    const struct xtable *prev_api;
    int (*alloc)(void *prototype, void **out, void *error_ctx, set_error_fn set_error);
    int (*from_py)(void *py_object, void **out);
    int (*to_py)(void *tensor, void **out_py_object);
    int (*view)(void *py_object, void *out_dltensor);
    int (*stream)(int device_type, int32_t device_id, void **out_stream);
} xtable;
_Static_assert(offsetof(xtable, alloc) == 16 && offsetof(xtable, stream) == 48, "1.3 layout");
#define NENTRIES 5

static void **entry_slot(xtable *t, int e) /* e: CS_XE_ALLOC .. CS_XE_STREAM */
{
    return (void **)((char *)t + 16 + 8 * (e - CS_XE_ALLOC));
}

/* ---- the tables followed, and one stub per entry and table ----
 * Stub k of an entry is `endbr64; mov $k, %r8d; jmp body`: no entry takes
 * more than four arguments, so the body gets the table's index as its
 * fifth. A table's entries are stubs whether it was patched in place or
 * answered with its shadow. The bodies (cs_xbody_*) are `used`: only the
 * stubs' asm calls them, and the link time optimizer sees no asm. */
#define NTAB 16

typedef struct xtab {
    xtable *orig;     /* the producer's table */
    xtable saved;     /* its entries as they were */
    xtable shadow;    /* capsan's: stubs forwarding to saved */
    int followed;     /* a version capsan knows: entries are stubs */
    int in_place;     /* orig's slots hold the stubs */
    _Atomic int judged; /* validated (R50), at its first reading */
} xtab;

static xtab tabs[NTAB];
static _Atomic unsigned ntabs;
static cs_spin tabs_mu = CS_SPIN_INIT;

#define STUBS(entry)                                                         \
    ".p2align 4\n.globl cs_xstubs_" entry "\n.hidden cs_xstubs_" entry "\n"    \
    "cs_xstubs_" entry ":\n"                                                 \
    ".set .Lxk, 0\n.rept 16\n.p2align 4\nendbr64\nmovl $.Lxk, %r8d\n"        \
    "jmp cs_xbody_" entry "\n.set .Lxk, .Lxk + 1\n.endr\n"
__asm__(".text\n" STUBS("alloc") STUBS("from_py") STUBS("to_py") STUBS("view") STUBS("stream"));
extern const char cs_xstubs_alloc[], cs_xstubs_from_py[], cs_xstubs_to_py[], cs_xstubs_view[],
    cs_xstubs_stream[];

static void *stub(int e, unsigned k)
{
    static const char *const base[NENTRIES] = {cs_xstubs_alloc, cs_xstubs_from_py, cs_xstubs_to_py,
                                               cs_xstubs_view, cs_xstubs_stream};
    return (void *)(base[e - CS_XE_ALLOC] + 16 * k);
}

static int is_stub(const void *p)
{
    for (int e = CS_XE_ALLOC; e <= CS_XE_STREAM; e++) {
        uintptr_t off = (uintptr_t)p - (uintptr_t)stub(e, 0);
        if (off < 16 * NTAB && !(off & 15))
            return 1;
    }
    return 0;
}

/* the table t is, as the producer's or as capsan's shadow */
static xtab *find(const void *t)
{
    unsigned n = atomic_load_explicit(&ntabs, memory_order_acquire);
    for (unsigned i = 0; i < n; i++)
        if (tabs[i].orig == t || &tabs[i].shadow == t)
            return &tabs[i];
    return NULL;
}

/* ---- findings about a call or a table ---- */

/* One finding per (place, what): a loop that breaks the contract says so
 * once. Only the failing path gets here. */
#define SEEN 512
static uintptr_t seen[SEEN];
static cs_spin seen_mu = CS_SPIN_INIT;

static int first_time(uintptr_t where, unsigned what)
{
    return cs_seen_first(seen, SEEN, &seen_mu, ((where * 31) ^ what) | 1);
}

static void check_failed(uint64_t obj, int entry, unsigned code, int64_t rc, uint64_t value,
                         const void *site)
{
    if (!first_time((uintptr_t)site, code))
        return;
    cs_event ev = {.kind = CS_EV_XCHECK, .obj = obj, .aux = (uint16_t)code, .a = (uint64_t)rc,
                   .b = value, .extra = (uint32_t)entry};
    cs_emit(&ev, 1, NULL, NULL);
}

/* ---- R50: a table, validated once, then followed ---- */

static int in_loaded_object(const void *p)
{
    Dl_info di;
    return dladdr(p, &di) && di.dli_fbase;
}

/* what the producer's table says (its saved copy: patched in place, its
 * slots hold stubs) */
static void validate(const xtab *x)
{
    const xtable *t = &x->saved, *prev = t->prev_api;
    uint64_t at = (uint64_t)(uintptr_t)x->orig;
    if (t->major != 1)
        check_failed(at, CS_XE_TABLE, CS_XT_VERSION, 0, t->major, x->orig);
    for (int e = CS_XE_ALLOC; e <= CS_XE_STREAM; e++)
        if (e != CS_XE_VIEW && !*entry_slot((xtable *)t, e))
            check_failed(at, e, CS_XT_NULL_ENTRY, 0, 0, (char *)x->orig + e);
    if (!in_loaded_object(x->orig))
        check_failed(at, CS_XE_TABLE, CS_XT_NOT_STATIC, 0, 0, x->orig);
    if (prev) {
        const xtab *px = find(prev);
        const xtable *p = px ? &px->saved : cs_probe_read(prev, sizeof *prev) ? prev : NULL;
        if (!p || p->major > t->major || (p->major == t->major && p->minor >= t->minor))
            check_failed(at, CS_XE_TABLE, CS_XT_PREV, 0, (uint64_t)(uintptr_t)prev, prev);
    }
}

/* Register t (tabs_mu held); its prev_api first. NULL when full. */
static xtab *adopt_locked(xtable *t, int depth)
{
    xtab *x = find(t);
    if (x)
        return x;
    unsigned n = atomic_load_explicit(&ntabs, memory_order_relaxed);
    if (n == NTAB || depth > 4 || !cs_probe_read(t, sizeof *t))
        return NULL;
    xtable copy = *t;
    xtab *prev = NULL;
    if (copy.prev_api && copy.prev_api != t && cs_probe_read(copy.prev_api, sizeof *t))
        prev = adopt_locked((xtable *)copy.prev_api, depth + 1);
    n = atomic_load_explicit(&ntabs, memory_order_relaxed);
    if (n == NTAB)
        return NULL;
    x = &tabs[n];
    x->orig = t;
    x->saved = copy;
    x->shadow = copy;
    x->followed = copy.major == 1;
    if (prev)
        x->shadow.prev_api = &prev->shadow;
    if (x->followed) {
        for (int e = CS_XE_ALLOC; e <= CS_XE_STREAM; e++)
            if (*entry_slot(&copy, e))
                *entry_slot(&x->shadow, e) = stub(e, n);
        /* in place where the producer's memory is writable: every entry, or
         * none (a half-patched table would be undone) */
        int ok = 1;
        for (int e = CS_XE_ALLOC; e <= CS_XE_STREAM && ok; e++)
            if (*entry_slot(&copy, e))
                ok = cs_probe_store(entry_slot(t, e), stub(e, n));
        if (!ok)
            for (int e = CS_XE_ALLOC; e <= CS_XE_STREAM; e++)
                cs_probe_store(entry_slot(t, e), *entry_slot(&copy, e));
        x->in_place = ok;
    }
    atomic_store_explicit(&ntabs, n + 1, memory_order_release);
    return x;
}

/* A table is judged when someone reads it (PyCapsule_GetPointer) or
 * first calls through it: one nobody uses (tvm-ffi's test wrapper's) harms
 * nobody. Findings go out with no lock of ours held. */
static void judge(const xtab *x)
{
    for (const xtab *y = x; y; y = y->shadow.prev_api ? find(y->shadow.prev_api) : NULL)
        if (!atomic_exchange(&((xtab *)y)->judged, 1))
            validate(y);
}

/* the first call through table k (a consumer that read it before capsan
 * started, and was followed by capsan_xapi_follow) */
static inline void used(unsigned k)
{
    if (__builtin_expect(!atomic_load_explicit(&tabs[k].judged, memory_order_relaxed), 0))
        judge(&tabs[k]);
}

void *cs_xapi_table(void *table, int reading)
{
    if (!table || is_stub(table))
        return table;
    xtab *x = find(table);
    if (!x) {
        cs_spin_lock(&tabs_mu);
        x = adopt_locked(table, 0);
        cs_spin_unlock(&tabs_mu);
    }
    if (reading)
        judge(x);
    if (!x || !x->followed)
        return table;
    return x->in_place || (void *)&x->shadow == table ? table : (void *)&x->shadow;
}

void cs_xapi_restore(void)
{
    unsigned n = atomic_load_explicit(&ntabs, memory_order_acquire);
    for (unsigned i = 0; i < n; i++) {
        xtab *x = &tabs[i];
        if (!x->in_place)
            continue;
        for (int e = CS_XE_ALLOC; e <= CS_XE_STREAM; e++)
            if (*entry_slot(&x->saved, e))
                cs_probe_store(entry_slot(x->orig, e), *entry_slot(&x->saved, e));
        x->in_place = 0;
    }
}

void *cs_xapi_original(const void *table, int entry)
{
    if (entry < CS_XE_ALLOC || entry > CS_XE_STREAM || !table)
        return NULL;
    xtab *x = find(table);
    if (x)
        return *entry_slot(&x->saved, entry);
    return cs_probe_read(table, sizeof(xtable)) ? *entry_slot((xtable *)table, entry) : NULL;
}

/* ---- the calling contract (R51, R56): around each Python-facing entry ---- */

typedef struct xcall {
    const void *site;  /* the caller's return address */
    int entry;
    int live, gil;
    int pending_error; /* an exception was set before the call: not judged */
    uint8_t flags;     /* cs_emit's GIL flags */
} xcall;

static void call_begin(xcall *c, int entry, const void *site, uint64_t obj)
{
    c->site = site;
    c->entry = entry;
    c->live = cs_py_live();
    c->gil = c->live && cs_gil_held();
    c->flags = (uint8_t)(c->live ? CS_EVF_GIL_KNOWN | (c->gil ? CS_EVF_GIL : 0) : 0);
    c->pending_error = c->gil && cs_py.Err_Occurred();
    if (c->live && !c->gil)
        check_failed(obj, entry, CS_XC_NO_GIL, 0, cs_py.free_threaded ? CS_NOGIL_FREE_THREADED : 0,
                     site);
}

/* rc and the Python error indicator must agree */
static void call_end(xcall *c, int rc, uint64_t obj)
{
    if (!c->gil || c->pending_error)
        return;
    int err = cs_py.Err_Occurred() != NULL;
    if (rc != 0 && !err)
        check_failed(obj, c->entry, CS_XC_RC_NO_ERROR, rc, (uint64_t)(uint32_t)rc, c->site);
    else if (rc == 0 && err)
        check_failed(obj, c->entry, CS_XC_OK_WITH_ERROR, rc, 0, c->site);
}

static int recording(void) { return cs_recording && cs_py.ok; }

/* an owning tensor handed to the caller (R51, R54) */
static void born(void *mt, uint16_t how, uint8_t flags, int entry, const void *site)
{
    if (!mt) {
        check_failed(0, entry, CS_XC_NULL_OUT, 0, 0, site);
        return;
    }
    cs_loan l;
    if (cs_dl_wrap(&l, mt, 1) && !l.deleter)
        cs_dl_took_null(mt); /* a crash at 0 names it */
    cs_dl_lent(&l, 0, (uint16_t)(CS_DLV_VERSIONED | how), flags);
}

/* ---- the entries ---- */

__attribute__((used)) int cs_xbody_from_py(void *obj, void **out, void *u2, void *u3, unsigned k)
{
    used(k);
    (void)u2, (void)u3;
    int (*fn)(void *, void **) = tabs[k].saved.from_py;
    if (!recording())
        return fn(obj, out);
    cs_xconv++; /* an FFI call after it is judged with its conversions (xffi.c) */
    const void *site = __builtin_return_address(0);
    xcall c;
    call_begin(&c, CS_XE_FROM_PY, site, (uint64_t)(uintptr_t)obj);
    int rc = fn(obj, out);
    call_end(&c, rc, (uint64_t)(uintptr_t)obj);
    if (rc == 0) {
        CS_STACK_HINT(); /* reached by a jmp from the entry's stub */
        born(out ? *out : NULL, CS_DLV_XFROM, c.flags, CS_XE_FROM_PY, site);
    }
    return rc;
}

/* The allocator's SetError, counted (R54): the caller's is called as it
 * would have been. Nested allocations keep their own count. */
static __thread struct {
    set_error_fn fn;
    unsigned calls;
} set_error_tls __attribute__((tls_model("initial-exec")));

static void counting_set_error(void *ctx, const char *kind, const char *msg)
{
    set_error_tls.calls++;
    if (set_error_tls.fn)
        set_error_tls.fn(ctx, kind, msg);
}

__attribute__((used)) int cs_xbody_alloc(void *proto, void **out, void *ctx, set_error_fn se,
                                          unsigned k)
{
    used(k);
    int (*fn)(void *, void **, void *, set_error_fn) = tabs[k].saved.alloc;
    if (!recording())
        return fn(proto, out, ctx, se);
    const void *site = __builtin_return_address(0);
    int live = cs_py_live();
    uint8_t flags = (uint8_t)(live ? CS_EVF_GIL_KNOWN | (cs_gil_held() ? CS_EVF_GIL : 0) : 0);
    __typeof__(set_error_tls) saved = set_error_tls;
    set_error_tls.fn = se;
    set_error_tls.calls = 0;
    int rc = fn(proto, out, ctx, counting_set_error);
    unsigned calls = set_error_tls.calls;
    set_error_tls = saved;
    if ((rc != 0 && calls != 1) || (rc == 0 && calls != 0))
        check_failed((uint64_t)(uintptr_t)proto, CS_XE_ALLOC, CS_XC_SETERROR, rc,
                     calls | (uint64_t)(rc != 0) << 32, site);
    if (rc == 0)
        born(out ? *out : NULL, CS_DLV_XALLOC, flags, CS_XE_ALLOC, site);
    return rc;
}

/* A struct given to to_py that capsan had not seen: wrapped before the
 * call, born when it returns, or first thing in its deleter if to_py runs
 * that inside (cs_dl_pending). */
static __thread cs_loan *pending_loan __attribute__((tls_model("initial-exec")));
static __thread int pending_born __attribute__((tls_model("initial-exec")));
static __thread uint8_t pending_flags __attribute__((tls_model("initial-exec")));

static void born_in_call(void *mt)
{
    if (!pending_loan || pending_loan->mt != mt)
        return;
    cs_dl_lent(pending_loan, 0, CS_DLV_VERSIONED | CS_DLV_XTO, pending_flags);
    pending_born = 1;
}

static int state_of(uint64_t key)
{
    cs_young_dl_adopt(key);
    cs_lc_lock(cs_lc, key);
    int st = cs_lc_state(cs_lc, CS_NS_DLPACK, key);
    cs_lc_unlock(cs_lc, key);
    return st;
}

__attribute__((used)) int cs_xbody_to_py(void *mt, void **out, void *u2, void *u3, unsigned k)
{
    used(k);
    (void)u2, (void)u3;
    int (*fn)(void *, void **) = tabs[k].saved.to_py;
    if (!recording() || !mt)
        return fn(mt, out);
    const void *site = __builtin_return_address(0);
    uint64_t key = (uint64_t)(uintptr_t)mt;
    xcall c;
    call_begin(&c, CS_XE_TO_PY, site, key);
    void **slot = cs_dl_deleter_slot(mt, 1);
    int st = cs_probe_read(slot, sizeof *slot) && *slot == (void *)cs_dl_deleter_tramp
                 ? state_of(key) : CS_ST_UNKNOWN;
    int known = st != CS_ST_UNKNOWN;
    cs_event hand = {.kind = CS_EV_XHANDOVER, .obj = key, .a = (uint64_t)(uintptr_t)tabs[k].orig,
                     .b = (uint64_t)(uintptr_t)site, .flags = c.flags};
    int rc;
    if (known) {
        if (st == CS_ST_RELEASED) {
            cs_emit(&hand, 1, NULL, NULL); /* a released tensor handed over: said first */
            rc = fn(mt, out);
        } else {
            rc = fn(mt, out);
            if (rc == 0) {
                CS_STACK_HINT();
                cs_emit(&hand, 1, NULL, NULL);
            } else if (state_of(key) == CS_ST_RELEASED)
                check_failed(key, CS_XE_TO_PY, CS_XC_TO_PY_RELEASED, rc, 0, site);
        }
    } else {
        cs_loan l;
        cs_dl_wrap(&l, mt, 1);
        if (l.np || !l.followed) {
            /* a malformed struct is said before to_py reads it */
            cs_dl_lent(&l, 0, CS_DLV_VERSIONED | CS_DLV_XTO, c.flags);
            rc = fn(mt, out);
            if (rc == 0 && l.followed)
                cs_emit(&hand, 1, NULL, NULL);
        } else {
            cs_loan *saved_loan = pending_loan;
            cs_dl_pending_t saved_pending = cs_dl_pending;
            int saved_born = pending_born;
            uint8_t saved_flags = pending_flags;
            pending_loan = &l;
            pending_born = 0;
            pending_flags = c.flags;
            cs_dl_pending = (cs_dl_pending_t){mt, born_in_call};
            rc = fn(mt, out);
            int inside = pending_born;
            cs_dl_pending = saved_pending;
            pending_loan = saved_loan;
            pending_born = saved_born;
            pending_flags = saved_flags;
            if (!inside) {
                CS_STACK_HINT();
                cs_dl_lent(&l, 0, (uint16_t)(CS_DLV_VERSIONED | CS_DLV_XTO | (rc == 0 ? CS_DLV_HANDED : 0)),
                           c.flags);
            } else if (rc != 0)
                check_failed(key, CS_XE_TO_PY, CS_XC_TO_PY_RELEASED, rc, 0, site);
        }
    }
    call_end(&c, rc, key);
    return rc;
}

__attribute__((used)) int cs_xbody_stream(int device_type, int32_t device_id, void **out, void *u3, unsigned k)
{
    used(k);
    (void)u3;
    int (*fn)(int, int32_t, void **) = tabs[k].saved.stream;
    if (!recording())
        return fn(device_type, device_id, out);
    xcall c;
    /* not a Python-facing entry (R56), but an error is a Python exception */
    c.site = __builtin_return_address(0);
    c.entry = CS_XE_STREAM;
    c.live = cs_py_live();
    c.gil = c.live && cs_gil_held();
    c.pending_error = c.gil && cs_py.Err_Occurred();
    int rc = fn(device_type, device_id, out);
    call_end(&c, rc, (uint64_t)(uintptr_t)tabs[k].orig);
    return rc;
}

/* ---- non-owning views (R53): watched by xview.c ---- */

__attribute__((used)) int cs_xbody_view(void *obj, void *out, void *u2, void *u3, unsigned k)
{
    used(k);
    (void)u2, (void)u3;
    int (*fn)(void *, void *) = tabs[k].saved.view;
    if (!recording())
        return fn(obj, out);
    cs_xconv++;
    const void *site = __builtin_return_address(0);
    xcall c;
    call_begin(&c, CS_XE_VIEW, site, (uint64_t)(uintptr_t)obj);
    int rc = fn(obj, out);
    call_end(&c, rc, (uint64_t)(uintptr_t)obj);
    if (rc != 0 || !out || !c.live)
        return rc;
    /* the DLTensor read as the head of a DLManagedTensor: its fields only */
    cs_dl_problem probs[8];
    uint64_t nbytes, data;
    uint32_t fp;
    cs_dl_check(out, 0, probs, 8, &nbytes, &fp, &data);
    cs_xview_born(out, data, nbytes, c.flags, c.gil);
    return rc;
}
