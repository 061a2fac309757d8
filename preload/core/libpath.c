/* What the runtime finds beside itself (libpath.h): the bundled
 * libunwind, the report tool. */
#include "libpath.h"

#include <dlfcn.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
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

static char cli[PATH_MAX];
static pthread_once_t cli_once = PTHREAD_ONCE_INIT;

static void find_cli(void)
{
    Dl_info di;
    char p[PATH_MAX + 32];
    if (!dladdr((void *)find_cli, &di) || !di.dli_fname)
        return;
    const char *slash = strrchr(di.dli_fname, '/');
    snprintf(p, sizeof p, "%.*s/../bin/capsan", slash ? (int)(slash - di.dli_fname) : 1,
             slash ? di.dli_fname : ".");
    if (!realpath(p, cli) || access(cli, X_OK) != 0)
        cli[0] = 0;
}

const char *cs_cli_path(void)
{
    pthread_once(&cli_once, find_cli);
    return cli;
}
