/* Which torch ignores a DLTensor's byte_offset on import (R17; see
 * torch_offset.h): told by the version of the libtorch module a consume
 * is called from. */
#include "torch_offset.h"

#include <dlfcn.h>
#include <fcntl.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* "MAJOR.MINOR" at s */
static int parse_version(const char *s, unsigned *major, unsigned *minor)
{
    char *end;
    unsigned long a = strtoul(s, &end, 10);
    if (end == s || *end != '.')
        return 0;
    const char *m = end + 1;
    unsigned long b = strtoul(m, &end, 10);
    if (end == m)
        return 0;
    *major = (unsigned)a;
    *minor = (unsigned)b;
    return 1;
}

/* The version of the torch a libtorch* module belongs to: from its file
 * name (Debian's libtorch_python.so.1.13.0), else from torch/version.py
 * beside its lib/ directory (the wheels: torch/lib/libtorch_python.so). */
static int torch_version(const char *path, unsigned *major, unsigned *minor)
{
    const char *so = strstr(path, ".so.");
    if (so && parse_version(so + 4, major, minor))
        return 1;
    const char *slash = strrchr(path, '/');
    char file[4096];
    if (!slash || (size_t)(slash - path) + sizeof "/../version.py" > sizeof file)
        return 0;
    memcpy(file, path, (size_t)(slash - path));
    memcpy(file + (slash - path), "/../version.py", sizeof "/../version.py");
    int fd = open(file, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return 0;
    char text[2048];
    ssize_t n = read(fd, text, sizeof text - 1);
    close(fd);
    if (n <= 0)
        return 0;
    text[n] = 0;
    /* the assignment, not a mention (__all__ names it first) */
    for (const char *v = text; (v = strstr(v, "__version__")); v++) {
        const char *q = v + sizeof "__version__" - 1;
        while (*q == ' ')
            q++;
        if (*q++ != '=')
            continue;
        while (*q == ' ')
            q++;
        if ((*q == '\'' || *q == '"') && parse_version(q + 1, major, minor))
            return 1;
    }
    return 0;
}

/* torch read from data and ignored byte_offset on import (R17; pytorch
 * issue 168177): 1.13 does [V]; 2.13 honors it [V] (the fix, PR 170432,
 * landed in 2026). A torch whose version cannot be told, or one between
 * the two, is taken to ignore it, as the rulebook says. Asked only for a
 * consume with byte_offset != 0; the answer is kept for the module. */
#define TORCH_OFFSET_FIXED_MAJOR 2
#define TORCH_OFFSET_FIXED_MINOR 13

int cs_consumer_ignores_offset(const void *ret)
{
    static _Atomic uintptr_t known; /* module base | 1 if it ignores it */
    Dl_info di;
    if (!ret || !dladdr(ret, &di) || !di.dli_fname || !strstr(di.dli_fname, "libtorch"))
        return 0;
    uintptr_t base = (uintptr_t)di.dli_fbase, k = atomic_load(&known);
    if (k && (k & ~(uintptr_t)1) == base)
        return (int)(k & 1);
    unsigned major, minor;
    int ignores = !torch_version(di.dli_fname, &major, &minor) ||
                  major < TORCH_OFFSET_FIXED_MAJOR ||
                  (major == TORCH_OFFSET_FIXED_MAJOR && minor < TORCH_OFFSET_FIXED_MINOR);
    atomic_store(&known, base | (uintptr_t)ignores);
    return ignores;
}
