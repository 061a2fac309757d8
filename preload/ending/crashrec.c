/* The crash's stacks into the trace (see crashrec.h). */
#include "crashrec.h"

#include <string.h>

#include "runtime.h"
#include "tracefile.h"
#include "tracefmt.h"

#define PY_MAX 64
#define NAME_MAX_ 240

/* a Python frame as the walk reported it, copied (bounded) */
static struct {
    char file[NAME_MAX_], name[NAME_MAX_];
    uint32_t line;
} py[PY_MAX];
static int npy;

static void copy_bounded(char *to, const char *from)
{
    size_t i = 0;
    for (; from && from[i] && i + 1 < NAME_MAX_; i++)
        to[i] = from[i];
    to[i] = 0;
}

static void take_python(void *ud, const char *file, const char *name, int line)
{
    (void)ud;
    if (npy == PY_MAX)
        return;
    copy_bounded(py[npy].file, file);
    copy_bounded(py[npy].name, name);
    py[npy].line = line > 0 ? (uint32_t)line : 0;
    npy++;
}

void cs_crashrec_write(const cs_crash_walk *w, int first, uint64_t pc, int tid)
{
    if (!cs_trace_started())
        return;
    cs_runtime_write_counts(cs_now_ns()); /* the plot's last point: the crash */
    npy = 0;
    cs_stack_crash_python(PY_MAX, take_python, NULL);
    uint32_t nn = w && w->n > first ? (uint32_t)(w->n - first) : 1;
    size_t size = sizeof(cs_rec_crash) + nn * sizeof(uint64_t);
    for (int i = 0; i < npy; i++)
        size += 4 + strlen(py[i].file) + 1 + strlen(py[i].name) + 1;
    cs_rec *hdr;
    unsigned char *p = cs_trace_begin(CS_REC_CRASH, size, &hdr);
    if (!p)
        return;
    cs_rec_crash c = {.nnative = nn, .npython = (uint32_t)npy, .os_tid = (uint64_t)tid};
    memcpy(p, &c, sizeof c);
    p += sizeof c;
    for (uint32_t i = 0; i < nn; i++) {
        uint64_t ip = w && w->n > first ? w->ip[first + (int)i] : pc;
        memcpy(p, &ip, sizeof ip);
        p += sizeof ip;
    }
    for (int i = 0; i < npy; i++) {
        memcpy(p, &py[i].line, 4);
        p += 4;
        size_t a = strlen(py[i].file) + 1, b = strlen(py[i].name) + 1;
        memcpy(p, py[i].file, a);
        memcpy(p + a, py[i].name, b);
        p += a + b;
    }
    cs_trace_commit(hdr, CS_REC_CRASH);
}
