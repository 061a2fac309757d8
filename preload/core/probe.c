/* Memory probes (see probe.h). A page of a remembered entry may be
 * unmapped later; only a pointer into such a page that is also garbage
 * gets past the probe, and DLPack structs live in the heap, whose pages
 * are rarely given back. */
#include "probe.h"

#include <errno.h>
#include <sys/uio.h>
#include <unistd.h>

#define PAGE_SHIFT 12

_Atomic uintptr_t cs_probe_known[CS_PROBE_PAGES];

/* The kernel cannot be asked (a seccomp profile refuses the call with
 * EPERM, as Docker's default does without CAP_SYS_PTRACE, or it is not
 * implemented): every page is then taken as readable, as before probes
 * existed, rather than every struct reported as unreadable. */
static _Atomic int no_kernel;

/* The kernel copies n bytes from or to this process's memory at remote:
 * 1 done, 0 that memory is not there or not writable (EFAULT), -1 the
 * kernel cannot be asked. */
static int kernel_copy(int write, void *local, void *remote, size_t n)
{
    if (atomic_load_explicit(&no_kernel, memory_order_relaxed))
        return -1;
    struct iovec l = {local, n}, r = {remote, n};
    ssize_t done = write ? process_vm_writev(getpid(), &l, 1, &r, 1, 0)
                         : process_vm_readv(getpid(), &l, 1, &r, 1, 0);
    if (done == (ssize_t)n)
        return 1;
    if (errno == EFAULT)
        return 0;
    atomic_store_explicit(&no_kernel, 1, memory_order_relaxed);
    return -1;
}

static int page_readable(uintptr_t page)
{
    _Atomic uintptr_t *k = cs_probe_entry(page);
    if ((atomic_load_explicit(k, memory_order_relaxed) & ~(uintptr_t)2) == (page << 2 | 1))
        return 1;
    char c;
    if (kernel_copy(0, &c, (void *)(page << PAGE_SHIFT), 1) == 0)
        return 0;
    atomic_store_explicit(k, page << 2 | 1, memory_order_relaxed);
    return 1;
}

int cs_probe_read_slow(const void *p, size_t n)
{
    uintptr_t a = (uintptr_t)p;
    if (a < 4096 || a >= 0x800000000000ull || !n || n > (1u << 20) || a + n < a)
        return 0;
    for (uintptr_t pg = a >> PAGE_SHIFT, last = (a + n - 1) >> PAGE_SHIFT; pg <= last; pg++)
        if (!page_readable(pg))
            return 0;
    return 1;
}

int cs_probe_store(void **slot, void *val)
{
    uintptr_t page = (uintptr_t)slot >> PAGE_SHIFT;
    _Atomic uintptr_t *k = cs_probe_entry(page);
    if (atomic_load_explicit(k, memory_order_relaxed) == (page << 2 | 3)) {
        *slot = val;
        return 1;
    }
    if (!cs_probe_read(slot, sizeof *slot))
        return 0;
    /* the store itself is the test: the kernel refuses a read-only page */
    int r = kernel_copy(1, &val, slot, sizeof val);
    if (r == 0)
        return 0;
    if (r < 0)
        *slot = val; /* no kernel to ask: as before probes existed */
    else
        atomic_store_explicit(k, page << 2 | 3, memory_order_relaxed);
    return 1;
}
