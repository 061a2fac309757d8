/* The END record a process killed by a signal could not write (seal.h). */
#include "seal.h"
#include "reader.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* Is [off, end of file) all zeros? A writer killed between reserving a
 * record and writing its header leaves a zero header with data after it
 * (FORMAT.md, Truncation): an END there would be read as part of it. */
static int zero_tail(int fd, uint64_t off)
{
    char buf[1 << 16];
    for (;;) {
        ssize_t n = pread(fd, buf, sizeof buf, (off_t)off);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0)
            return 0;
        if (n == 0)
            return 1;
        for (ssize_t i = 0; i < n; i++)
            if (buf[i])
                return 0;
        off += (uint64_t)n;
    }
}

int cs_trace_seal(const char *path, long pid, int sig, char *why, size_t whylen)
{
    char err[512];
    cs_trace *t = cs_trace_open(path, err, sizeof err);
    if (!t) {
        snprintf(why, whylen, "%s", err);
        return -1;
    }
    int rc = -1;
    if (t->hdr.pid != (uint64_t)pid)
        snprintf(why, whylen, "the trace is of pid %llu, not %ld",
                 (unsigned long long)t->hdr.pid, pid);
    else if (t->has_end)
        rc = 0; /* the runtime's own handler wrote it (SIGSEGV, SIGABRT, ...) */
    else if (t->error || t->trailing_offset)
        snprintf(why, whylen, "the trace's end is damaged; left as it is");
    else {
        struct {
            cs_rec h;
            cs_rec_end e;
        } rec;
        memset(&rec, 0, sizeof rec);
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        rec.e.how = CS_END_SIGNAL;
        rec.e.status = sig;
        rec.e.time_ns = (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
        rec.e.events = cs_trace_events_observed(t);
        rec.h.type = CS_REC_END;
        rec.h.size = sizeof rec;
        int fd = open(path, O_RDWR | O_CLOEXEC | O_NOFOLLOW);
        if (fd < 0)
            snprintf(why, whylen, "%s", strerror(errno));
        else if (!zero_tail(fd, t->data_end))
            snprintf(why, whylen, "data after the end of the trace (a record cut short); left as it is");
        else if (pwrite(fd, &rec, sizeof rec, (off_t)t->data_end) != (ssize_t)sizeof rec)
            snprintf(why, whylen, "cannot write: %s", strerror(errno));
        else
            rc = 1;
        if (fd >= 0)
            close(fd);
    }
    cs_trace_close(t);
    return rc;
}
