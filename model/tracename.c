/* Trace file names (see tracename.h). */
#include "tracename.h"

#include <string.h>

int cs_log_path_none(const char *lp)
{
    return !strcmp(lp, "/dev/null") || !strcmp(lp, "stderr");
}

/* pid in decimal at out (room for 21 bytes); returns its length. No
 * stdio: this runs in a signal handler. */
static size_t put_pid(char *out, long pid)
{
    char tmp[24];
    size_t n = 0;
    unsigned long v = pid < 0 ? 0 : (unsigned long)pid;
    do
        tmp[n++] = (char)('0' + v % 10);
    while ((v /= 10));
    for (size_t i = 0; i < n; i++)
        out[i] = tmp[n - 1 - i];
    return n;
}

int cs_trace_name(char *out, size_t cap, const char *lp, long pid)
{
    if (cs_log_path_none(lp) || cap < 24)
        return -1;
    size_t k = 0;
    int had_pid = 0;
    for (const char *s = lp; *s; s++) {
        if (k + 24 >= cap)
            return -1;
        if (s[0] == '%' && s[1] == 'p') {
            k += put_pid(out + k, pid);
            had_pid = 1;
            s++;
        } else if (s[0] == '%' && s[1] == '%') {
            out[k++] = '%';
            s++;
        } else {
            out[k++] = *s;
        }
    }
    if (!had_pid) {
        out[k++] = '.';
        k += put_pid(out + k, pid);
    }
    out[k] = 0;
    return 0;
}

/* a run of digits at *n (moved past it): the pid, or -1 when there is none */
static long take_pid(const char **n)
{
    long v = 0;
    const char *d = *n;
    while (**n >= '0' && **n <= '9' && *n - d < 18)
        v = v * 10 + (*(*n)++ - '0');
    return *n == d ? -1 : v;
}

long cs_trace_name_pid(const char *name, const char *base)
{
    long pid = -1;
    int had_pid = 0;
    const char *n = name;
    for (const char *b = base; *b; b++) {
        if (b[0] == '%' && (b[1] == 'p' || b[1] == '%')) {
            b++;
            if (*b == '%') {
                if (*n++ != '%')
                    return -1;
                continue;
            }
            if ((pid = take_pid(&n)) < 0)
                return -1;
            had_pid = 1;
        } else if (*n++ != *b) {
            return -1;
        }
    }
    if (!had_pid) {
        if (*n++ != '.' || (pid = take_pid(&n)) < 0)
            return -1;
    }
    return *n ? -1 : pid;
}
