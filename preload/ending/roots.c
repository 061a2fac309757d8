/* Roots at exit: which live blocks a loaded object's static data still
 * points to (see roots.h). */
#include "roots.h"

#include <dlfcn.h>
#include <link.h>
#include <stdlib.h>
#include <string.h>

#include "alloc.h"

typedef struct scan {
    const uint64_t *keys;
    size_t n;
    unsigned char *seen;
    uintptr_t self;
    cs_root_cb cb;
    void *ud;
} scan;

static void scan_range(scan *s, uintptr_t base, const uint64_t *p, const uint64_t *end)
{
    uint64_t lo = s->keys[0], hi = s->keys[s->n - 1];
    for (; p < end; p++) {
        uint64_t w = *p;
        if (w < lo || w > hi)
            continue; /* most words: not a heap address at all */
        long i = cs_key_index(s->keys, s->n, w);
        if (i >= 0 && !s->seen[i]) {
            s->seen[i] = 1;
            s->cb(s->ud, w, (uint64_t)(uintptr_t)p, base, CS_WHERE_DATA);
        }
    }
}

static int object_cb(struct dl_phdr_info *info, size_t size, void *arg)
{
    (void)size;
    scan *s = arg;
    if (info->dlpi_addr == s->self)
        return 0; /* capsan's own tables point at every block */
    for (int i = 0; i < info->dlpi_phnum; i++) {
        const ElfW(Phdr) *ph = &info->dlpi_phdr[i];
        if (ph->p_type != PT_LOAD || !(ph->p_flags & PF_W))
            continue;
        uintptr_t a = info->dlpi_addr + ph->p_vaddr;
        uintptr_t b = a + ph->p_memsz;
        a = (a + 7) & ~(uintptr_t)7;
        scan_range(s, info->dlpi_addr, (const uint64_t *)a, (const uint64_t *)(b & ~(uintptr_t)7));
    }
    return 0;
}

size_t cs_roots_scan(const uint64_t *keys, size_t n, cs_root_cb cb, void *ud)
{
    if (!n)
        return 0;
    scan s = {.keys = keys, .n = n, .seen = cs_calloc(n, 1), .cb = cb, .ud = ud};
    if (!s.seen)
        return 0;
    Dl_info di;
    if (dladdr((void *)(uintptr_t)&cs_roots_scan, &di))
        s.self = (uintptr_t)di.dli_fbase; /* its load address, as got.c compares it */
    dl_iterate_phdr(object_cb, &s);
    size_t hits = 0;
    for (size_t i = 0; i < n; i++)
        hits += s.seen[i];
    cs_free(s.seen);
    return hits;
}
