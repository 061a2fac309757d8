/* libunwind's memory checks without descriptors (unwfd.h). */
#include "unwfd.h"

#include <errno.h>
#include <stdarg.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "probe.h"

/* above any RLIMIT_NOFILE, so never a real descriptor */
#define FAKE_READ 0x7ffffff0
#define FAKE_WRITE 0x7ffffff1

static int hook_pipe2(int fds[2], int flags)
{
    (void)flags;
    fds[0] = FAKE_READ;
    fds[1] = FAKE_WRITE;
    return 0;
}

static ssize_t hook_read(int fd, void *buf, size_t n)
{
    if (fd == FAKE_READ) {
        errno = EAGAIN; /* "the pipe is fine, just empty" */
        return -1;
    }
    return read(fd, buf, n);
}

static ssize_t hook_write(int fd, const void *buf, size_t n)
{
    if (fd == FAKE_WRITE) {
        /* libunwind's question: can this address be read? */
        if (cs_probe_read(buf, n ? n : 1))
            return (ssize_t)n;
        errno = EFAULT;
        return -1;
    }
    return write(fd, buf, n);
}

/* libunwind 1.6 reads and writes its pipe through syscall() */
static long hook_syscall(long nr, ...)
{
    va_list ap;
    va_start(ap, nr);
    long a[6];
    for (int i = 0; i < 6; i++)
        a[i] = va_arg(ap, long);
    va_end(ap);
    if (nr == SYS_read && a[0] == FAKE_READ)
        return hook_read((int)a[0], (void *)a[1], (size_t)a[2]);
    if (nr == SYS_write && a[0] == FAKE_WRITE)
        return hook_write((int)a[0], (const void *)a[1], (size_t)a[2]);
    return syscall(nr, a[0], a[1], a[2], a[3], a[4], a[5]);
}

static int hook_close(int fd)
{
    if (fd == FAKE_READ || fd == FAKE_WRITE)
        return 0;
    return close(fd);
}

const cs_hook cs_unwfd_hooks[] = {
    {"pipe2", (void *)hook_pipe2, "libunwind"},
    {"read", (void *)hook_read, "libunwind"},
    {"write", (void *)hook_write, "libunwind"},
    {"close", (void *)hook_close, "libunwind"},
    {"syscall", (void *)hook_syscall, "libunwind"},
};
const int cs_unwfd_nhooks = sizeof cs_unwfd_hooks / sizeof cs_unwfd_hooks[0];
