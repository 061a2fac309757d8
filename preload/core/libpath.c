/* Loading the bundled libunwind by path (libpath.h). */
#include "libpath.h"

#include <dlfcn.h>
#include <limits.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

void *cs_libunwind_open(int mode)
{
    /* the directory this very object was loaded from: libcapsan.so's path
     * as the loader has it (LD_PRELOAD and ctypes both give it absolute) */
    Dl_info di;
    if (dladdr((void *)cs_libunwind_open, &di) && di.dli_fname) {
        const char *slash = strrchr(di.dli_fname, '/');
        char path[PATH_MAX];
        if (slash && snprintf(path, sizeof path, "%.*s/capsan.libs/%s", (int)(slash - di.dli_fname),
                              di.dli_fname, CS_BUNDLED_UNWIND) < (int)sizeof path &&
            access(path, F_OK) == 0)
            return dlopen(path, mode); /* never the system's beside it */
    }
    return dlopen("libunwind.so.8", mode);
}
