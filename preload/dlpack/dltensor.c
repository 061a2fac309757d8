/* DLPack struct checks (see dltensor.h). */
#include "dltensor.h"

#include <stddef.h>
#include <string.h>

#include "plausible.h"
#include "probe.h"
#include "tracefmt.h"

/* Own declarations of the layouts (dlpack.h 0.6 has no versioned struct). */
typedef struct { int32_t device_type, device_id; } dl_device;
typedef struct { uint8_t code, bits; uint16_t lanes; } dl_dtype;
typedef struct {
    void *data;
    dl_device device;
    int32_t ndim;
    dl_dtype dtype;
    int64_t *shape;
    int64_t *strides;
    uint64_t byte_offset;
} dl_tensor;
typedef struct { uint32_t major, minor; } dl_version;
typedef struct {
    dl_version version;
    void *manager_ctx;
    void (*deleter)(void *);
    uint64_t flags;
    dl_tensor dl_tensor;
} dl_managed_versioned;

_Static_assert(sizeof(dl_tensor) == 48, "DLTensor layout");
_Static_assert(offsetof(dl_managed_versioned, dl_tensor) == CS_DLV_TENSOR_OFF, "versioned layout");

#define MAX_NDIM 64

/* DLPack structs and their shape/strides arrays are 8-byte aligned, and
 * must be there to be read (a fault would be capsan's, not the program's) */
static inline int plausible(const void *p)
{
    return cs_plausible(p) && ((uintptr_t)p & 7) == 0;
}

static inline __attribute__((always_inline)) int readable(const void *p, size_t n)
{
    return plausible(p) && cs_probe_read(p, n);
}

/* readable, and known to be when it lies within the page of `near`, a
 * range proven readable just before (numpy keeps shape and strides in
 * the managed struct's own allocation) */
static inline __attribute__((always_inline)) int readable_near(const void *p, size_t n,
                                                               const void *near)
{
    uintptr_t a = (uintptr_t)p, pg = (uintptr_t)near >> 12;
    if (plausible(p) && (a >> 12) == pg && ((a + n - 1) >> 12) == pg)
        return 1;
    return readable(p, n);
}

/* the whole managed struct: its DLTensor and its deleter */
static size_t struct_size(int versioned)
{
    return versioned ? sizeof(dl_managed_versioned) : CS_DL_DELETER_OFF + sizeof(void *);
}

static const dl_tensor *tensor_of(const void *mt, int versioned)
{
    return (const dl_tensor *)((const char *)mt + (versioned ? CS_DLV_TENSOR_OFF : 0));
}

/* Telling "changed" from "unchanged" is all it is for, three times per
 * exchange, so it is as cheap as a change of any one word still always
 * shows: the struct's six words each times its own odd constant (one
 * multiply with the load), summed; then the shape and strides folded in,
 * each step (x ^ word) times an odd constant, which maps distinct x to
 * distinct results. */
static inline uint64_t word(const void *p, size_t i)
{
    uint64_t w;
    memcpy(&w, (const char *)p + 8 * i, 8);
    return w;
}

static inline uint64_t fold(uint64_t x, const void *p, size_t nwords)
{
    for (size_t i = 0; i < nwords; i++)
        x = (x ^ word(p, i)) * 0x9e3779b97f4a7c15ull;
    return x;
}

/* the fingerprint of a DLTensor already proven readable */
static uint32_t tensor_fingerprint(const dl_tensor *t)
{
    _Static_assert(sizeof *t == 48, "six words");
    uint64_t x = word(t, 0) * 0x2545f491u + word(t, 1) * 0x6c078965u + word(t, 2) * 0x5bd1e995u +
                 word(t, 3) * 0x27d4eb2fu + word(t, 4) * 0x165667b1u + word(t, 5) * 0x61c88647u;
    if (t->ndim > 0 && t->ndim <= MAX_NDIM) {
        size_t n = (size_t)t->ndim * sizeof(int64_t);
        if (readable_near(t->shape, n, t))
            x = fold(x ^ 1, t->shape, (size_t)t->ndim);
        if (readable_near(t->strides, n, t))
            x = fold(x ^ 2, t->strides, (size_t)t->ndim);
    }
    x *= 0xff51afd7ed558ccdull;
    uint32_t h = (uint32_t)(x ^ (x >> 32));
    return h ? h : 1; /* 0 means "not taken" */
}

uint32_t cs_dl_fingerprint(const void *mt, int versioned)
{
    return readable(mt, struct_size(versioned)) ? tensor_fingerprint(tensor_of(mt, versioned)) : 0;
}

int cs_dl_view(const void *mt, int versioned, uint64_t *offset, uint64_t *data)
{
    *offset = *data = 0;
    if (!readable(mt, struct_size(versioned)))
        return 0;
    const dl_tensor *t = tensor_of(mt, versioned);
    *offset = t->byte_offset;
    *data = (uint64_t)(uintptr_t)t->data;
    return 1;
}

uint32_t cs_dl_consume_view(const void *mt, int versioned, uint64_t *offset, uint64_t *data)
{
    return cs_dl_view(mt, versioned, offset, data) ? tensor_fingerprint(tensor_of(mt, versioned))
                                                   : 0;
}

static int valid_device(int32_t d)
{
    return (d >= 1 && d <= 4) || (d >= 7 && d <= 18);
}

int cs_dl_check(const void *mt, int versioned, cs_dl_problem *out, int max, uint64_t *nbytes,
                uint32_t *fingerprint, uint64_t *data)
{
    int n = 0;
#define PROBLEM(r, c, v)                                                     \
    do {                                                                     \
        if (n < max)                                                         \
            out[n++] = (cs_dl_problem){(r), (c), (int64_t)(v)};              \
    } while (0)
    *nbytes = 0;
    *fingerprint = 0;
    *data = 0;
    if (!plausible(mt)) {
        PROBLEM(1, CS_BAD_NULL_POINTER, (uintptr_t)mt);
        return n;
    }
    if (!readable(mt, struct_size(versioned))) {
        PROBLEM(1, CS_BAD_UNREADABLE, (uintptr_t)mt);
        return n;
    }
    const dl_tensor *t = tensor_of(mt, versioned);
    if (versioned) {
        const dl_managed_versioned *v = mt;
        if (v->version.major != 1)
            PROBLEM(13, CS_BAD_VERSION_MAJOR, v->version.major);
        if (v->flags & ~(uint64_t)7)
            PROBLEM(21, CS_BAD_FLAGS, v->flags);
    }
    if (t->ndim < 0 || t->ndim > MAX_NDIM) {
        PROBLEM(15, CS_BAD_NDIM, t->ndim);
        return n; /* shape cannot be read safely */
    }
    int64_t elems = 1;
    if (t->ndim > 0) {
        if (!t->shape) {
            PROBLEM(15, CS_BAD_NULL_SHAPE, 0);
            elems = -1;
        } else if (!readable_near(t->shape, (size_t)t->ndim * sizeof(int64_t), t)) {
            PROBLEM(15, CS_BAD_UNREADABLE_SHAPE, (uintptr_t)t->shape);
            elems = -1;
        } else {
            for (int i = 0; i < t->ndim; i++) {
                if (t->shape[i] < 0) {
                    PROBLEM(15, CS_BAD_NEGATIVE_SHAPE, t->shape[i]);
                    elems = -1;
                    break;
                }
                elems *= t->shape[i];
            }
        }
        if (versioned && !t->strides) {
            const dl_managed_versioned *v = mt;
            if (v->version.major > 1 || (v->version.major == 1 && v->version.minor >= 2))
                PROBLEM(16, CS_BAD_NULL_STRIDES_V12, 0);
        }
    }
    uint8_t code = t->dtype.code, bits = t->dtype.bits;
    if (code > 17)
        PROBLEM(18, CS_BAD_DTYPE_CODE, code);
    else if (code == 6 && bits != 8)
        PROBLEM(18, CS_BAD_BOOL_BITS, bits);
    else if ((code == 15 || code == 16) ? bits != 6 : code == 17 ? bits != 4
             : (code <= 1) ? (bits == 0 || (bits % 8 && bits != 1 && bits != 2 && bits != 4))
                           : (bits == 0 || bits % 8))
        PROBLEM(18, CS_BAD_DTYPE_BITS, bits);
    if (t->dtype.lanes == 0)
        PROBLEM(18, CS_BAD_DTYPE_LANES, 0);
    if (!valid_device(t->device.device_type))
        PROBLEM(19, CS_BAD_DEVICE_TYPE, t->device.device_type);
    else if ((t->device.device_type == 1 || t->device.device_type == 3 ||
              t->device.device_type == 11) && t->device.device_id != 0)
        PROBLEM(19, CS_BAD_DEVICE_ID, t->device.device_id);
    if (elems > 0 && !t->data)
        PROBLEM(17, CS_BAD_NULL_DATA, 0);
    if (elems >= 0)
        *nbytes = (uint64_t)elems * (((uint64_t)bits * (t->dtype.lanes ? t->dtype.lanes : 1) + 7) / 8);
    *fingerprint = tensor_fingerprint(t); /* the struct was proven readable above */
    *data = (uint64_t)(uintptr_t)t->data;
    return n;
#undef PROBLEM
}

uint64_t cs_dl_data(const void *mt)
{
    if (!readable(mt, 64))
        return 0;
    /* a versioned struct starts with its version {1, x}; a legacy one with
     * its data pointer, which is never that small */
    const dl_managed_versioned *v = mt;
    if (v->version.major == 1 && v->version.minor < 256)
        return (uint64_t)(uintptr_t)v->dl_tensor.data;
    return (uint64_t)(uintptr_t)tensor_of(mt, 0)->data;
}

int cs_dl_device_type(const void *mt, int versioned)
{
    return readable(mt, struct_size(versioned)) ? tensor_of(mt, versioned)->device.device_type : 0;
}
