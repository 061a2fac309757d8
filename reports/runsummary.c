/* `capsan run`'s line for a clean run (see runsummary.h). */
#include "runsummary.h"

#include <dirent.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>

#include "reader.h"
#include "tracename.h"
#include <unistd.h>

typedef struct unended_trace {
    char *path;
    long pid;
} unended_trace;

static int by_pid(const void *a, const void *b)
{
    const unended_trace *x = a, *y = b;
    return (x->pid > y->pid) - (x->pid < y->pid);
}

/* list[n] = a copy of path (dropped when out of memory: then kept) */
static size_t add_path(char ***list, size_t n, const char *path)
{
    char **v = realloc(*list, (n + 1) * sizeof *v);
    if (!v)
        return n;
    *list = v;
    return (v[n] = strdup(path)) ? n + 1 : n;
}

int cs_run_summary(const char *log_path, uint64_t since_realtime_ns, FILE *out,
                   void (*unended)(const char *path, long pid, void *ud), void *ud,
                   int remove_clean)
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
    unended_trace *un = NULL;
    size_t nun = 0, nrm = 0;
    char **rm = NULL;
    struct dirent *de;
    while ((de = readdir(d))) {
        if (cs_trace_name_pid(de->d_name, base) < 0)
            continue;
        char path[PATH_MAX + 256], err[512];
        snprintf(path, sizeof path, "%s/%s", dir, de->d_name);
        cs_trace *t = cs_trace_open(path, err, sizeof err);
        if (!t)
            continue; /* not a trace (or not ours): the report names it */
        if (t->hdr.start_realtime_ns >= since_realtime_ns && !t->has_end) {
            unended_trace *v = realloc(un, (nun + 1) * sizeof *v);
            if (v) {
                un = v;
                un[nun++] = (unended_trace){strdup(path), (long)t->hdr.pid};
            }
        } else if (t->hdr.start_realtime_ns >= since_realtime_ns) {
            procs++;
            /* found something: its own report said so at its exit */
            int clean_one = !t->end.findings && !t->error;
            if (!clean_one)
                clean = 0;
            else if (remove_clean)
                nrm = add_path(&rm, nrm, path);
            tensors += t->end.tensors;
            blocks += t->end.blocks;
            arrow += t->end.arrow; /* 0 in an older END */
            stopped += t->end.how == CS_END_STOPPED_EXIT;
            events += cs_trace_events_observed(t);
        }
        cs_trace_close(t);
    }
    closedir(d);
    /* after the reader let go of them (the counts are taken) */
    for (size_t i = 0; i < nrm; i++) {
        unlink(rm[i]);
        free(rm[i]);
    }
    free(rm);
    if (nun)
        qsort(un, nun, sizeof *un, by_pid);
    for (size_t i = 0; i < nun; i++) {
        if (un[i].path && unended)
            unended(un[i].path, un[i].pid, ud);
        free(un[i].path);
    }
    free(un);
    if (!clean || (!procs && nun))
        return 0;
    if (!procs)
        fprintf(out, "capsan: no findings: no process made a DLPack, NumPy or Arrow event "
                     "(nothing was watched)\n");
    else
        fprintf(out, "capsan: no findings%s: %u process%s traced, %llu tensor%s, %llu NumPy "
                     "block%s and %llu Arrow struct%s watched (%llu events)\n",
                nun ? " in the processes that ended" : "", procs, procs == 1 ? "" : "es",
                (unsigned long long)tensors,
                tensors == 1 ? "" : "s", (unsigned long long)blocks, blocks == 1 ? "" : "s",
                (unsigned long long)arrow, arrow == 1 ? "" : "s", (unsigned long long)events);
    if (stopped)
        fprintf(out, "capsan: %u process%s called capsan.stop(): no leak check at %s exit\n",
                stopped, stopped == 1 ? "" : "es", stopped == 1 ? "its" : "their");
    return 1;
}
