/* Quarantine of released DLPack managed structs (see quarantine.h).
 *
 * The trampoline marks the struct whose deleter it runs (cs_qr_call);
 * the free() and PyMem_Free() hooks ask cs_qr_take about every block
 * freed meanwhile on that thread, so outside deleters the cost is one TLS
 * load. A free() of a block that holds the struct (the struct itself, or
 * a manager allocation it lies in) is deferred into a ring; the oldest
 * entries are freed for real when the count or the bytes are over budget.
 * A deleter run on a struct already released (a double delete, reported
 * by then) frees it a second time: that free is never done, whether the
 * block still waits in the ring or not. */
#include "quarantine.h"

#include <dlfcn.h>
#include <malloc.h>
#include <stdint.h>
#include <stdlib.h>

#include "dltensor.h"
#include "options.h"
#include "pyapi.h"
#include "spin.h"
#include "tracefmt.h"

__thread void *cs_qr_mt __attribute__((tls_model("initial-exec")));
/* the marked struct's layout: 1 versioned, 0 not; -1: the struct was
 * released already, so its free now is a second one */
static __thread int qr_versioned __attribute__((tls_model("initial-exec")));
/* what goes back into a quarantined struct's deleter field */
static __thread void *qr_rearm __attribute__((tls_model("initial-exec")));

#define QR_CAP 4096      /* quarantine_count's upper bound */
#define QR_EVICT 8       /* real frees per quarantined block, at most */

typedef struct qent {
    void *p;
    size_t bytes;
    unsigned how; /* CS_FREED_LIBC or CS_FREED_PYMEM */
} qent;

static qent ring[QR_CAP];
static unsigned head, count, closed;
static size_t held_bytes;
static cs_spin mu = CS_SPIN_INIT;
static void (*real_pymem_free)(void *);

void cs_qr_call(void (*fn)(void *), void *mt, int versioned, void *rearm)
{
    if (cs_opt.quarantine_count <= 0 || !mt) {
        fn(mt);
        return;
    }
    void *saved = cs_qr_mt, *saved_r = qr_rearm;
    int saved_v = qr_versioned;
    cs_qr_mt = mt;
    qr_versioned = versioned;
    qr_rearm = rearm;
    fn(mt);
    cs_qr_mt = saved;
    qr_versioned = saved_v;
    qr_rearm = saved_r;
}

/* The bytes of the struct itself (DLManagedTensor or the versioned one). */
static size_t struct_span(int versioned)
{
    return versioned > 0 ? CS_DLV_TENSOR_OFF + 48 : 64;
}

/* A quarantined block's real free: PyMem_Free needs the GIL. */
static int can_free(const qent *e)
{
    return e->how == CS_FREED_LIBC || (real_pymem_free && cs_py_has_gil());
}

static void free_now(const qent *e)
{
    if (e->how == CS_FREED_LIBC)
        free(e->p);
    else
        real_pymem_free(e->p);
}

/* p's block holds the marked struct: its size, or 0 if it does not. */
static size_t holds_struct(uintptr_t a, uintptr_t m, unsigned how, int versioned)
{
    size_t span = struct_span(versioned);
    if (how != CS_FREED_LIBC)
        return a == m ? span : 0; /* a PyMem block's size is unknown: only the struct itself */
    size_t sz = malloc_usable_size((void *)a);
    return m + span <= a + sz ? sz : 0;
}

int cs_qr_take_slow(void *p, unsigned how)
{
    uintptr_t a = (uintptr_t)p, m = (uintptr_t)cs_qr_mt;
    /* cs_qr_take asked: p lies at most CS_QR_REACH below the struct */
    if (closed)
        return 0;
    int versioned = qr_versioned;
    size_t bytes = holds_struct(a, m, how, versioned);
    if (!bytes)
        return 0;
    if (versioned < 0)
        return 1; /* a released struct's second free: never done (it may wait in the ring) */
    if (how == CS_FREED_PYMEM && !real_pymem_free)
        *(void **)&real_pymem_free = dlsym(RTLD_DEFAULT, "PyMem_Free");
    qent victims[QR_EVICT];
    int nv = 0, kept = 0;
    long max_n = cs_opt.quarantine_count < QR_CAP ? cs_opt.quarantine_count : QR_CAP;
    size_t max_b = (size_t)cs_opt.quarantine_bytes;
    cs_spin_lock(&mu);
    if (bytes <= max_b) {
        /* room first: the oldest go, while they can be freed here */
        while (count && (count >= (unsigned)max_n || held_bytes + bytes > max_b) &&
               nv < QR_EVICT && can_free(&ring[head])) {
            victims[nv++] = ring[head];
            held_bytes -= ring[head].bytes;
            head = (head + 1) % QR_CAP;
            count--;
        }
        if (count < (unsigned)max_n && held_bytes + bytes <= max_b) {
            ring[(head + count) % QR_CAP] = (qent){.p = p, .bytes = bytes, .how = how};
            count++;
            held_bytes += bytes;
            kept = 1;
        }
    }
    cs_spin_unlock(&mu);
    if (kept) /* a second release now lands in capsan */
        *cs_dl_deleter_slot((void *)m, versioned) = qr_rearm;
    for (int i = 0; i < nv; i++)
        free_now(&victims[i]);
    return kept;
}

void cs_qr_flush(void)
{
    cs_spin_lock(&mu);
    closed = 1;
    for (unsigned i = 0; i < count; i++) {
        qent *e = &ring[(head + i) % QR_CAP];
        if (e->how == CS_FREED_LIBC)
            free(e->p);
    }
    count = 0;
    held_bytes = 0;
    cs_spin_unlock(&mu);
}

void cs_qr_fork_lock(int lock)
{
    if (lock)
        cs_spin_lock(&mu);
    else
        cs_spin_unlock(&mu);
}

void cs_qr_own_memory(void (*fn)(void *ud, const void *p, size_t n), void *ud)
{
    cs_spin_lock(&mu);
    for (unsigned i = 0; i < count; i++) {
        const qent *e = &ring[(head + i) % QR_CAP];
        fn(ud, e->p, e->bytes);
    }
    cs_spin_unlock(&mu);
}
