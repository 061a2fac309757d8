/* Arrow structs handed over by address (see byaddr.h): the hooks of
 * libarrow's export and import functions.
 *
 * They are C++ functions. Each returns a Status or a Result (not
 * trivially copyable: returned through a hidden pointer, the first
 * argument) and takes its objects by reference and its shared_ptrs by
 * value (passed by invisible reference): every argument is a pointer or
 * an integer in a register, at most six. So one C body forwards any of
 * them with its six argument registers as they came, and the table says
 * which arguments are the structs. Names are matched exactly: the mangled
 * name is the signature, and the signature is what the table describes. */
#include "byaddr.h"

#include <dlfcn.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "arrow_int.h"
#include "arrow_rec.h"
#include "arrow_wrap.h"
#include "capsan.h"
#include "options.h"
#include "runtime.h"
#include "stack.h"

__thread const void *cs_ar_cap_structs[2] __attribute__((tls_model("initial-exec")));
__thread unsigned cs_ar_cap_next __attribute__((tls_model("initial-exec")));
/* inside one of these hooks on this thread: libarrow calling its own
 * exported functions is one hand-over, not two */
static __thread int depth __attribute__((tls_model("initial-exec")));

typedef uintptr_t (*fn6)(uintptr_t, uintptr_t, uintptr_t, uintptr_t, uintptr_t, uintptr_t);

typedef struct entry {
    const char *name;
    uint8_t import;
    uint8_t arg, type; /* the array or stream struct's argument (0: none) and cs_ar_type */
    uint8_t sarg;      /* the ArrowSchema's argument (0: none; may be NULL at run time) */
} entry;

#define S CS_AR_SCHEMA
#define A CS_AR_ARRAY
#define ST CS_AR_STREAM
#define DA CS_AR_DEVICE_ARRAY
#define DS CS_AR_DEVICE_STREAM
#define MM "RKSt8functionIFNS_6ResultISt10shared_ptrINS_13MemoryManagerEEEEilEE"
/* argument 0 is the hidden result pointer; X(index, name, import, struct arg, its type,
 * schema arg) */
#define LIST(X) \
    X(0, "_ZN5arrow10ExportTypeERKNS_8DataTypeEP11ArrowSchema", 0, 0, 0, 2) \
    X(1, "_ZN5arrow11ExportFieldERKNS_5FieldEP11ArrowSchema", 0, 0, 0, 2) \
    X(2, "_ZN5arrow12ExportSchemaERKNS_6SchemaEP11ArrowSchema", 0, 0, 0, 2) \
    X(3, "_ZN5arrow11ExportArrayERKNS_5ArrayEP10ArrowArrayP11ArrowSchema", 0, 2, A, 3) \
    X(4, "_ZN5arrow17ExportRecordBatchERKNS_11RecordBatchEP10ArrowArrayP11ArrowSchema", 0, 2, A, 3) \
    X(5, "_ZN5arrow17ExportDeviceArrayERKNS_5ArrayESt10shared_ptrINS_6Device9SyncEventEEP16ArrowDeviceArrayP11ArrowSchema", 0, 3, DA, 4) \
    X(6, "_ZN5arrow23ExportDeviceRecordBatchERKNS_11RecordBatchESt10shared_ptrINS_6Device9SyncEventEEP16ArrowDeviceArrayP11ArrowSchema", 0, 3, DA, 4) \
    X(7, "_ZN5arrow23ExportRecordBatchReaderESt10shared_ptrINS_17RecordBatchReaderEEP16ArrowArrayStream", 0, 2, ST, 0) \
    X(8, "_ZN5arrow18ExportChunkedArrayESt10shared_ptrINS_12ChunkedArrayEEP16ArrowArrayStream", 0, 2, ST, 0) \
    X(9, "_ZN5arrow29ExportDeviceRecordBatchReaderESt10shared_ptrINS_17RecordBatchReaderEEP22ArrowDeviceArrayStream", 0, 2, DS, 0) \
    X(10, "_ZN5arrow24ExportDeviceChunkedArrayESt10shared_ptrINS_12ChunkedArrayEENS_20DeviceAllocationTypeEP22ArrowDeviceArrayStream", 0, 3, DS, 0) \
    X(11, "_ZN5arrow10ImportTypeEP11ArrowSchema", 1, 0, 0, 1) \
    X(12, "_ZN5arrow11ImportFieldEP11ArrowSchema", 1, 0, 0, 1) \
    X(13, "_ZN5arrow12ImportSchemaEP11ArrowSchema", 1, 0, 0, 1) \
    X(14, "_ZN5arrow11ImportArrayEP10ArrowArrayP11ArrowSchema", 1, 1, A, 2) \
    X(15, "_ZN5arrow11ImportArrayEP10ArrowArraySt10shared_ptrINS_8DataTypeEE", 1, 1, A, 0) \
    X(16, "_ZN5arrow17ImportRecordBatchEP10ArrowArrayP11ArrowSchema", 1, 1, A, 2) \
    X(17, "_ZN5arrow17ImportRecordBatchEP10ArrowArraySt10shared_ptrINS_6SchemaEE", 1, 1, A, 0) \
    X(18, "_ZN5arrow17ImportDeviceArrayEP16ArrowDeviceArrayP11ArrowSchema" MM, 1, 1, DA, 2) \
    X(19, "_ZN5arrow17ImportDeviceArrayEP16ArrowDeviceArraySt10shared_ptrINS_8DataTypeEE" MM, 1, 1, DA, 0) \
    X(20, "_ZN5arrow23ImportDeviceRecordBatchEP16ArrowDeviceArrayP11ArrowSchema" MM, 1, 1, DA, 2) \
    X(21, "_ZN5arrow23ImportDeviceRecordBatchEP16ArrowDeviceArraySt10shared_ptrINS_6SchemaEE" MM, 1, 1, DA, 0) \
    X(22, "_ZN5arrow23ImportRecordBatchReaderEP16ArrowArrayStream", 1, 1, ST, 0) \
    X(23, "_ZN5arrow18ImportChunkedArrayEP16ArrowArrayStream", 1, 1, ST, 0) \
    X(24, "_ZN5arrow29ImportDeviceRecordBatchReaderEP22ArrowDeviceArrayStream" MM, 1, 1, DS, 0) \
    X(25, "_ZN5arrow24ImportDeviceChunkedArrayEP22ArrowDeviceArrayStream" MM, 1, 1, DS, 0)
#define ENTRY(i, n, im, a, t, sa) {n, im, a, t, sa},
static const entry tab[] = {LIST(ENTRY)};
#define N ((int)(sizeof tab / sizeof tab[0]))
static void *_Atomic orig[N];

/* The real function: looked up from the object that called (its slot
 * was patched before it was ever bound, so the slot cannot tell). One
 * libarrow per process is assumed. */
static fn6 real(int i, const uintptr_t *slot)
{
    void *f = atomic_load_explicit(&orig[i], memory_order_acquire);
    if (f)
        return (fn6)f;
    Dl_info di;
    if (dladdr((void *)*slot, &di) && di.dli_fname) {
        void *h = dlopen(di.dli_fname, RTLD_LAZY | RTLD_NOLOAD);
        if (h) {
            f = dlsym(h, tab[i].name);
            dlclose(h);
        }
    }
    if (!f)
        f = dlsym(RTLD_DEFAULT, tab[i].name);
    if (f)
        atomic_store_explicit(&orig[i], f, memory_order_release);
    return (fn6)f;
}

/* Addresses where capsan followed a struct handed over by address: one
 * found released there later was moved out or released (an importer
 * refuses it, as it must), not handed over empty. Direct-mapped: an
 * address forgotten makes a later empty hand-over there a finding. */
#define SEEN 4096
static _Atomic uintptr_t seen[SEEN];
static unsigned seen_slot(const void *s)
{
    return (unsigned)((((uintptr_t)s >> 3) * 0x9e3779b97f4a7c15ull) >> 52) & (SEEN - 1);
}
static void seen_put(const void *s)
{
    atomic_store_explicit(&seen[seen_slot(s)], (uintptr_t)s, memory_order_relaxed);
}
static int seen_at(const void *s)
{
    return atomic_load_explicit(&seen[seen_slot(s)], memory_order_relaxed) == (uintptr_t)s;
}

static int capsule_struct(const void *s)
{
    if (s && (cs_ar_cap_structs[0] == s || cs_ar_cap_structs[1] == s)) {
        cs_ar_forget_capsule_struct(s);
        return 1;
    }
    return 0;
}

static void emit_at(cs_event *ev, const uintptr_t *slot)
{
    cs_stack_hint = slot;
    cs_emit(ev, 1, NULL, NULL);
}

/* A birth by address: s, filled and live, followed from here (found: met
 * first at an import, rel its producer's release) */
static ar_rec *birth(void *s, int type, void *found, const uintptr_t *slot)
{
    ar_rec *r = cs_ar_rec_alloc(type);
    if (!r)
        return NULL;
    r->done = DONE_CAPSULE | DONE_PARENT; /* no capsule: retired once released */
    r->byaddr = (uint8_t)(BA_BORN | (found ? BA_SHALLOW : 0));
    unsigned bad;
    uint64_t badval = 0;
    if (!cs_ar_wrap(r, s, &bad, &badval)) {
        r->done = 0;
        cs_ar_rec_done(r, DONE_ALL);
        return NULL;
    }
    seen_put(s);
    cs_event ev = {.kind = CS_EV_AR_EXPORT, .obj = (uint64_t)(uintptr_t)r,
                   .b = (uint64_t)(uintptr_t)s, .c = (uint64_t)(uintptr_t)found,
                   .aux = (uint16_t)(type | CS_AR_BY_ADDR | (found ? CS_AR_FOUND : 0))};
    emit_at(&ev, slot);
    if (bad)
        cs_ar_check_failed(r, NULL, bad, badval, ev.stack);
    return r;
}

/* s about to be moved into an importer */
static void imported(void *s, int type, const uintptr_t *slot)
{
    if (!s)
        return;
    const layout *L = &lay[type];
    if (!cs_probe_read(s, L->full))
        return;
    void *rel = FIELD(s, L->rel);
    ar_rec *r = FIELD(s, L->pd);
    int ours = is_rec(r) && r->type == type;
    if (!rel) {
        /* a struct capsan followed that was moved out or released: the
         * importer refuses it ("Cannot import released"), as it must */
        if (ours || seen_at(s))
            return;
        cs_event ev = {.kind = CS_EV_AR_CHECK, .obj = (uint64_t)(uintptr_t)s,
                       .b = (uint64_t)(uintptr_t)s, .aux = CS_ARK_IMPORT_RELEASED,
                       .extra = (uint32_t)type};
        emit_at(&ev, slot);
        return;
    }
    if (cs_ar_is_tramp(rel, type)) {
        if (!ours || r->cap)
            return; /* a capsule's struct imported directly: the capsule path's */
    } else if (!(r = birth(s, type, rel, slot))) {
        return;
    }
    r->byaddr |= BA_IMPORTED;
    cs_event ev = {.kind = CS_EV_AR_BORROW, .obj = (uint64_t)(uintptr_t)r,
                   .b = (uint64_t)(uintptr_t)s, .aux = CS_ARB_IMPORT};
    emit_at(&ev, slot);
}

/* s filled by an export that succeeded */
static void exported(void *s, int type, const uintptr_t *slot)
{
    if (!s || !cs_probe_read(s, lay[type].full) || !FIELD(s, lay[type].rel))
        return;
    birth(s, type, NULL, slot);
}

static uintptr_t body(int i, const uintptr_t *slot, uintptr_t a0, uintptr_t a1, uintptr_t a2,
                      uintptr_t a3, uintptr_t a4, uintptr_t a5)
{
    fn6 f = real(i, slot);
    if (!f)
        abort(); /* patched only where the name is imported: it is defined somewhere */
    if (!cs_recording || !cs_opt.arrow_wrap || depth)
        return f(a0, a1, a2, a3, a4, a5);
    const entry *e = &tab[i];
    uintptr_t a[6] = {a0, a1, a2, a3, a4, a5};
    void *main = e->arg ? (void *)a[e->arg] : NULL, *sch = e->sarg ? (void *)a[e->sarg] : NULL;
    /* the capsule path's own call (pyarrow's __arrow_c_*__ and
     * _import_from_c_capsule): forwarded with nothing else done */
    if (capsule_struct(main))
        main = NULL;
    if (capsule_struct(sch))
        sch = NULL;
    if (!main && !sch)
        return f(a0, a1, a2, a3, a4, a5);
    depth++;
    if (e->import) {
        if (main)
            imported(main, e->type, slot);
        if (sch)
            imported(sch, CS_AR_SCHEMA, slot);
    }
    uintptr_t rc = f(a0, a1, a2, a3, a4, a5);
    /* an export's Status: OK is a NULL state pointer */
    if (!e->import && cs_probe_read((void *)a0, sizeof(void *)) && !*(void **)a0) {
        if (main)
            exported(main, e->type, slot);
        if (sch)
            exported(sch, CS_AR_SCHEMA, slot);
    }
    depth--;
    return rc;
}

#define HOOK(i, n, im, a, t, sa)                                                                 \
    static uintptr_t hook##i(uintptr_t a0, uintptr_t a1, uintptr_t a2, uintptr_t a3, uintptr_t a4, \
                             uintptr_t a5)                                                       \
    {                                                                                            \
        return body(i, CS_CALLER_SLOT(), a0, a1, a2, a3, a4, a5);                                \
    }
LIST(HOOK)

#define HOOKENT(i, n, im, a, t, sa) {n, (void *)hook##i, NULL},
const cs_hook cs_ar_addr_hooks[] = {LIST(HOOKENT)};
const int cs_ar_addr_nhooks = sizeof cs_ar_addr_hooks / sizeof cs_ar_addr_hooks[0];
_Static_assert(sizeof cs_ar_addr_hooks / sizeof cs_ar_addr_hooks[0] == N, "a hook per entry");
