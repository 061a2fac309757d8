/* `capsan run`'s line for a clean run (see runsummary.h). */
#include "runsummary.h"

#include <dirent.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>

#include "reader.h"

/* name is base.PID */
static int is_trace_name(const char *name, const char *base)
{
    size_t n = strlen(base);
    if (strncmp(name, base, n) != 0 || name[n] != '.' || !name[n + 1])
        return 0;
    for (const char *p = name + n + 1; *p; p++)
        if (*p < '0' || *p > '9')
            return 0;
    return 1;
}

int cs_run_summary(const char *log_path, uint64_t since_realtime_ns, FILE *out)
{
    char dir[PATH_MAX];
    const char *slash = strrchr(log_path, '/');
    const char *base = slash ? slash + 1 : log_path;
    snprintf(dir, sizeof dir, "%.*s", slash ? (int)(slash - log_path) : 1, slash ? log_path : ".");
    if (slash && slash == log_path)
        snprintf(dir, sizeof dir, "/");
    DIR *d = opendir(dir);
    if (!d)
        return 0;
    unsigned procs = 0, stopped = 0;
    uint64_t tensors = 0, blocks = 0, arrow = 0, events = 0;
    int clean = 1;
    struct dirent *de;
    while (clean && (de = readdir(d))) {
        if (!is_trace_name(de->d_name, base))
            continue;
        char path[PATH_MAX + 256], err[512];
        snprintf(path, sizeof path, "%s/%s", dir, de->d_name);
        cs_trace *t = cs_trace_open(path, err, sizeof err);
        if (!t)
            continue; /* not a trace (or not ours): the report names it */
        if (t->hdr.start_realtime_ns >= since_realtime_ns) {
            procs++;
            /* ended without its verdict (killed), or found something: the
             * run's other lines say so */
            if (!t->has_end || t->end.findings || t->error)
                clean = 0;
            tensors += t->end.tensors;
            blocks += t->end.blocks;
            arrow += t->end.arrow; /* 0 in an older END */
            stopped += t->end.how == CS_END_STOPPED_EXIT;
            events += cs_trace_events_observed(t);
        }
        cs_trace_close(t);
    }
    closedir(d);
    if (!clean)
        return 0;
    if (!procs)
        fprintf(out, "capsan: no findings: no process made a DLPack, NumPy or Arrow event "
                     "(nothing was watched)\n");
    else
        fprintf(out, "capsan: no findings: %u process%s traced, %llu tensor%s, %llu NumPy "
                     "block%s and %llu Arrow struct%s watched (%llu events)\n",
                procs, procs == 1 ? "" : "es", (unsigned long long)tensors,
                tensors == 1 ? "" : "s", (unsigned long long)blocks, blocks == 1 ? "" : "s",
                (unsigned long long)arrow, arrow == 1 ? "" : "s", (unsigned long long)events);
    if (stopped)
        fprintf(out, "capsan: %u process%s called capsan.stop(): no leak check at %s exit\n",
                stopped, stopped == 1 ? "" : "es", stopped == 1 ? "its" : "their");
    return 1;
}
