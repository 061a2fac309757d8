/* numpy's free() calls and every other object's: the checks each free()
 * makes (a consumed tensor's data, a handler's ctx, a released managed
 * struct), and array_dealloc's free() of data no handler made, its call
 * sites learned from numpy's code once numpy is imported. */
#include "numpy_int.h"
#include "arrow_home.h"
#include "dataguard.h"
#include "npwrap.h"

#include <dlfcn.h>
#include <link.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "exitroots.h"
#include "freefilter.h"
#include "libpath.h"
#include "options.h"
#include "pyapi.h"
#include "quarantine.h"
#include "runtime.h"
#include "young.h"

/* where numpy's array_dealloc calls free() (see hook_free): the return
 * addresses of its free() calls, 0 until learned */
_Atomic uintptr_t free_sites[MAX_FREE_SITES];
int dealloc_known; /* learned, or given up: learn_dealloc stops */

/* ---- numpy's free() of an OWNDATA array's data that has no handler ----
 * array_dealloc, ndarray's tp_dealloc, frees such data with libc free():
 * one call site in numpy 1.24 to 2.5. numpy 1.24 read
 * NUMPY_WARN_IF_NO_MEM_POLICY with getenv() just before it; numpy 2 reads
 * a flag it set once at import, so the call site is what tells. It is
 * learned once numpy's module is in sys.modules (under the GIL): the
 * function numpy's ndarray type names as tp_dealloc (subclasses defined in
 * Python reach it through subtype_dealloc), its bounds from its unwind
 * info (libunwind, which unwind.c loaded), and in its code the calls that
 * go through the object's GOT slot for free() (patched to hook_np_free).
 * Only the call site itself counts: frees that array_dealloc's callees
 * reach by tail calls (the dimensions' PyMem_RawFree) share its return
 * addresses otherwise. */
#define TP_DEALLOC_OFFSET 48 /* offsetof(PyTypeObject, tp_dealloc): every 64-bit CPython 3 */

static int dealloc_bounds(uintptr_t fn, uintptr_t *lo, uintptr_t *hi)
{
    /* unw_proc_info_t starts with start_ip and end_ip; the rest is room */
    uint64_t pi[32] = {0};
    void *h = cs_libunwind_open(RTLD_NOW | RTLD_LOCAL | RTLD_NOLOAD);
    if (!h)
        return 0;
    int (*info)(void *, uint64_t, uint64_t *, void *) =
        (int (*)(void *, uint64_t, uint64_t *, void *))dlsym(h, "_ULx86_64_get_proc_info_by_ip");
    void **space = dlsym(h, "_ULx86_64_local_addr_space");
    int ok = info && space && *space && info(*space, fn, pi, NULL) == 0 && pi[0] <= fn &&
             fn < pi[1] && pi[1] - pi[0] < (1u << 16);
    dlclose(h);
    if (ok) {
        *lo = pi[0];
        *hi = pi[1];
    }
    return ok;
}

/* the loaded segments of the object that holds one address */
typedef struct segs {
    uintptr_t at;
    int n;
    uintptr_t lo[8], hi[8];
    int exec[8];
} segs;

static int segs_cb(struct dl_phdr_info *info, size_t size, void *data)
{
    (void)size;
    segs *s = data;
    int mine = 0;
    for (int i = 0; i < info->dlpi_phnum; i++) {
        const ElfW(Phdr) *ph = &info->dlpi_phdr[i];
        uintptr_t lo = info->dlpi_addr + ph->p_vaddr;
        if (ph->p_type == PT_LOAD && s->at >= lo && s->at < lo + ph->p_memsz)
            mine = 1;
    }
    if (!mine)
        return 0;
    for (int i = 0; i < info->dlpi_phnum && s->n < 8; i++) {
        const ElfW(Phdr) *ph = &info->dlpi_phdr[i];
        if (ph->p_type == PT_LOAD && (ph->p_flags & PF_R)) {
            s->lo[s->n] = info->dlpi_addr + ph->p_vaddr;
            s->hi[s->n] = s->lo[s->n] + ph->p_memsz;
            s->exec[s->n++] = !!(ph->p_flags & PF_X);
        }
    }
    return 1;
}

static int in_segs(const segs *s, uintptr_t a, size_t len, int exec)
{
    for (int i = 0; i < s->n; i++)
        if (a >= s->lo[i] && a + len <= s->hi[i] && (!exec || s->exec[i]))
            return 1;
    return 0;
}

/* A GOT slot of this object that calls free(): got.c patched it already
 * (free is hooked in every object). Never take free's own address here: a
 * non-PIE python's canonical PLT entry for free would then serve this
 * library's calls too, and that entry goes through a patched slot. */
static int free_slot(const segs *s, uintptr_t slot)
{
    return in_segs(s, slot, sizeof(uintptr_t), 0) &&
           (*(const uintptr_t *)slot == (uintptr_t)hook_np_free ||
            *(const uintptr_t *)slot == (uintptr_t)hook_free);
}

/* A PLT stub at t that jumps through a free() slot: [endbr64] [bnd] jmp *disp(%rip) */
static int free_stub(const segs *s, uintptr_t t)
{
    if (!in_segs(s, t, 16, 1))
        return 0;
    const uint8_t *c = (const uint8_t *)t;
    if (c[0] == 0xf3 && c[1] == 0x0f && c[2] == 0x1e && c[3] == 0xfa)
        c += 4;
    if (c[0] == 0xf2)
        c++;
    if (c[0] != 0xff || c[1] != 0x25)
        return 0;
    int32_t d;
    memcpy(&d, c + 2, 4);
    return free_slot(s, (uintptr_t)(c + 6) + (intptr_t)d);
}

/* Return addresses of the free() calls in [lo, hi): call rel32 to a free
 * stub, or call *disp(%rip) through a free slot (-fno-plt). A byte pattern
 * inside another instruction would have to decode to a call whose target
 * is that very stub: not checked further. */
static int find_free_calls(const segs *s, uintptr_t lo, uintptr_t hi, uintptr_t *out, int max)
{
    int n = 0;
    if (!in_segs(s, lo, hi - lo, 1))
        return 0;
    for (uintptr_t a = lo; a + 5 <= hi && n < max; a++) {
        const uint8_t *c = (const uint8_t *)a;
        int32_t d;
        if (c[0] == 0xe8) {
            memcpy(&d, c + 1, 4);
            if (free_stub(s, a + 5 + (intptr_t)d))
                out[n++] = a + 5;
        } else if (c[0] == 0xff && c[1] == 0x15 && a + 6 <= hi) {
            memcpy(&d, c + 2, 4);
            if (free_slot(s, a + 6 + (intptr_t)d))
                out[n++] = a + 6;
        }
    }
    return n;
}

/* numpy's C-API table, read as import_array does (the capsule's own
 * name: numpy 1.x leaves it NULL), for npwrap.c's constructor hooks */
static int wrap_api(PyObject_ *mod)
{
    PyObject_ *cap = cs_py.Object_GetAttrString(mod, "_ARRAY_API");
    if (!cap)
        return 0; /* the caller restores the error state */
    cs_npwrap_install(cs_py.Capsule_GetPointer(cap, cs_py.Capsule_GetName(cap)));
    cs_py.DecRef(cap); /* the table is static in numpy's module */
    return 1;
}

void learn_dealloc(void)
{
    if (!cs_py.ok || !cs_py.Object_GetAttrString || !cs_py_has_gil())
        return;
    if (!cs_py.Import_GetModuleDict || !cs_py.Dict_GetItemString) {
        dealloc_known = 1;
        return;
    }
    PyObject_ *t, *v, *tb;
    cs_py.Err_Fetch(&t, &v, &tb); /* numpy may allocate with an exception set */
    /* numpy 2 keeps a numpy.core shim: the first name is the module */
    PyObject_ *mod = cs_py_module("numpy._core._multiarray_umath");
    if (!mod)
        mod = cs_py_module("numpy.core._multiarray_umath");
    /* numpy 2's multi-phase init puts the module in sys.modules before it
     * runs: until _ARRAY_API is there, learn again later */
    if (mod && !atomic_load_explicit(&free_sites[0], memory_order_relaxed)) {
        PyObject_ *type = cs_py.Object_GetAttrString(mod, "ndarray");
        uintptr_t fn = type ? *(const uintptr_t *)((const char *)type + TP_DEALLOC_OFFSET) : 0;
        uintptr_t lo, hi, sites[MAX_FREE_SITES];
        segs sg = {.at = fn};
        int n = 0;
        if (fn && dealloc_bounds(fn, &lo, &hi) && dl_iterate_phdr(segs_cb, &sg))
            n = find_free_calls(&sg, lo, hi, sites, MAX_FREE_SITES);
        for (int i = 0; i < n; i++)
            atomic_store_explicit(&free_sites[i], sites[i], memory_order_release);
        if (type)
            cs_py.DecRef(type);
        if (cs_opt.verbosity && (n || type))
            dprintf(2, "==%d==capsan: numpy's array_dealloc: %d free() call(s)%s\n", (int)getpid(),
                    n, n ? "" : ": numpy-foreign-free is off");
        if (!n && type)
            atomic_store(&free_sites[0], 1); /* no free() call: never a site */
    }
    if (mod && wrap_api(mod)) {
        dealloc_known = 1; /* numpy is imported: never again */
        cs_exitroots_arm(); /* what daemon threads hold at exit */
    }
    cs_py.Err_Restore(t, v, tb);
}

static inline int is_free_site(uintptr_t site)
{
    for (int i = 0; i < MAX_FREE_SITES; i++) {
        uintptr_t s = atomic_load_explicit(&free_sites[i], memory_order_relaxed);
        if (s == site)
            return 1;
        if (!s)
            return 0;
    }
    return 0;
}

/* Every free() of every patched object: the checks that concern any
 * block, a few loads each. */
/* past the free() filter: a consumed tensor's data, a handler's ctx */
static __attribute__((noinline)) void free_watched(uintptr_t a)
{
    /* a consumed tensor's data (dataguard.c): near a data start, or a
     * block that reaches one further on */
    if (cs_ff_hit(a) || cs_dg_big(a))
        cs_dg_check_slow(a, CS_FREED_LIBC);
    /* the holder of a moved Arrow stream (arrow_home.c) */
    if (atomic_load_explicit(&cs_ar_nhomes, memory_order_relaxed) && cs_ff_hit(a))
        cs_ar_home_freed(a);
    unsigned b = ctx_bit(a);
    /* free(NULL) frees nothing: a handler whose ctx is NULL (numpy's
     * default) is not stale because another ctx shares NULL's filter bit */
    if ((atomic_load_explicit(&ctx_bits[b >> 6], memory_order_relaxed) & (1ull << (b & 63))) && a)
        note_ctx_free(a);
}

static inline __attribute__((always_inline)) int free_checks(void *p)
{
    uintptr_t a = (uintptr_t)p;
    cs_frees++;
    /* a block near a consumed tensor's data start, or any while a tensor
     * is consumed (it may be an arena, freed whole) */
    if (cs_ff_free_hit(a))
        free_watched(a);
    /* a released managed struct: its free waits (quarantine.c) */
    return cs_qr_take(p, CS_FREED_LIBC);
}

void hook_free(void *p)
{
    if (!free_checks(p))
        free(p);
}

/* numpy's own free() calls: array_dealloc's sites free an array's data
 * when no handler does (a foreign block given OWNDATA); the other objects'
 * frees never come from there */
void hook_np_free(void *p)
{
    if (__builtin_expect(is_free_site((uintptr_t)__builtin_return_address(0)), 0) && p &&
        cs_recording) {
        cs_event w, ev = {.kind = CS_EV_NP_FOREIGN_FREE, .obj = (uint64_t)(uintptr_t)p};
        cs_young_adopt((uint64_t)(uintptr_t)p); /* a block a handler gave, still young */
        if (cs_npwrap_find((uintptr_t)p, &w)) /* the line that made an array around it */
            cs_emit(&w, 0, NULL, NULL);
        cs_emit(&ev, 1, NULL, NULL); /* reported before a bad free can abort */
    }
    if (!free_checks(p))
        free(p);
}
