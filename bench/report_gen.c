/* Writes a synthetic capsan trace of N EVENT records, as a record_all=1
 * run of a busy numpy <-> torch program would leave behind: DLPack
 * export / consume / delete / destroy cycles and NumPy alloc / free pairs
 * on a pool of reused addresses, a COUNTS record every 2000 events, and a
 * few findings (double deletes, DLPack and NumPy leaks from two stacks).
 *
 *   report_gen OUT [NEVENTS] [--unique]
 *
 * --unique gives every object a fresh address (no reuse), the worst case
 * for a reader whose memory must not grow with freed objects.
 * Prints "events=N findings=F leaks=L leaked_bytes=B" on stdout.
 * Layout: model/tracefmt.h, reports/FORMAT.md. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tracefmt.h"

#define START_MONO 1000000000ull
#define POOL 4096            /* reused addresses per namespace */
#define COUNTS_EVERY 2000
#define FINDING_EVERY 1000000

static FILE *out;
static uint64_t n_written;   /* EVENT records */

static void rec(uint16_t type, const void *payload, size_t n)
{
    static const uint8_t zeros[8];
    size_t padded = (n + 7) & ~(size_t)7;
    cs_rec r = {.type = type, .flags = 0, .size = (uint32_t)(8 + padded)};
    fwrite(&r, sizeof r, 1, out);
    fwrite(payload, 1, n, out);
    fwrite(zeros, 1, padded - n, out);
}

static void rec_str2(uint16_t type, const void *fixed, size_t fn, const char *a, const char *b)
{
    char buf[4096];
    size_t n = fn;
    memcpy(buf, fixed, fn);
    if (a) {
        memcpy(buf + n, a, strlen(a) + 1);
        n += strlen(a) + 1;
    }
    if (b) {
        memcpy(buf + n, b, strlen(b) + 1);
        n += strlen(b) + 1;
    }
    rec(type, buf, n);
}

static uint64_t now_ns(void)
{
    return START_MONO + n_written * 100;    /* 10M events/s of program time */
}

static void event(uint8_t kind, uint64_t obj, uint64_t a, uint64_t b, uint64_t c,
                  uint32_t stack, uint32_t thread)
{
    cs_event ev = {.kind = kind, .flags = CS_EVF_GIL, .thread = thread, .time_ns = now_ns(),
                   .obj = obj, .a = a, .b = b, .c = c, .stack = stack};
    rec(CS_REC_EVENT, &ev, sizeof ev);
    n_written++;
}

static void frame(uint32_t id, uint32_t parent, uint64_t value)
{
    cs_rec_frame f = {.id = id, .parent = parent, .value = value};
    rec(CS_REC_FRAME, &f, sizeof f);
}

static void code(uint32_t id, const char *file, const char *name, uint32_t first)
{
    cs_rec_code c = {.code_id = id, .firstlineno = first, .filename_len = (uint32_t)strlen(file),
                     .name_len = (uint32_t)strlen(name)};
    rec_str2(CS_REC_CODE, &c, sizeof c, file, name);
}

/* stack leaves */
enum { ST_EXPORT = 4, ST_CONSUME = 6, ST_DELETE = 7, ST_DESTROY = 8, ST_ALLOC = 10,
       ST_FREE = 11, ST_LEAK_EXPORT = 12, ST_LEAK_ALLOC = 13 };

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: report_gen OUT [NEVENTS] [--unique]\n");
        return 2;
    }
    uint64_t target = argc > 2 ? strtoull(argv[2], NULL, 10) : 10000000ull;
    int unique = argc > 3 && strcmp(argv[3], "--unique") == 0;
    out = fopen(argv[1], "wb");
    if (!out) {
        perror(argv[1]);
        return 1;
    }
    static char iobuf[1 << 20];
    setvbuf(out, iobuf, _IOFBF, sizeof iobuf);

    cs_file_header h = {.version = CS_TRACE_VERSION, .header_size = sizeof h, .pid = 31337,
                        .ppid = 1, .start_realtime_ns = 1700000000000000000ull,
                        .start_mono_ns = START_MONO};
    memcpy(h.magic, CS_TRACE_MAGIC, 8);
    fwrite(&h, sizeof h, 1, out);

    /* prologue */
    {
        char buf[256];
        cs_rec_process p = {.argc = 2};
        size_t n = 0;
        memcpy(buf, &p, sizeof p);
        n = sizeof p;
        const char *strs[] = {"/usr/bin/python3", "train.py", "/usr/bin/python3.11"};
        for (int i = 0; i < 3; i++) {
            memcpy(buf + n, strs[i], strlen(strs[i]) + 1);
            n += strlen(strs[i]) + 1;
        }
        rec(CS_REC_PROCESS, buf, n);
        const char *opts = "record_all=1:log_path=capsan.trace";
        rec(CS_REC_OPTIONS, opts, strlen(opts) + 1);
        for (uint32_t t = 1; t <= 2; t++) {
            cs_rec_thread th = {.thread = t, .os_tid = 31337 + t - 1};
            rec_str2(CS_REC_THREAD, &th, sizeof th, t == 1 ? "MainThread" : "loader", NULL);
        }
        const char *mp = "/nonexistent/libfakeproducer.so";
        cs_rec_module m = {.base = 0x7f0000000000ull, .lo = 0x7f0000000000ull,
                           .hi = 0x7f0000100000ull, .build_id_len = 4,
                           .path_len = (uint32_t)strlen(mp)};
        char mb[256];
        memcpy(mb, &m, sizeof m);
        memcpy(mb + sizeof m, "\xca\xfe\xba\xbe", 4);
        memcpy(mb + sizeof m + 4, mp, strlen(mp) + 1);
        rec(CS_REC_MODULE, mb, sizeof m + 4 + strlen(mp) + 1);
        code(1, "/srv/train.py", "<module>", 1);
        code(2, "/srv/train.py", "load_batch", 10);
        code(3, "/srv/model.py", "step", 40);
        code(4, "/srv/model.py", "leaky_step", 60);
        /* <module>:30 -> load_batch:12 -> native export frame */
        frame(1, 0, CS_FRAME_PY_VALUE(1, 30, 1));
        frame(2, 1, CS_FRAME_PY_VALUE(2, 12, 0));
        frame(3, 1, CS_FRAME_PY_VALUE(3, 44, 0));
        frame(ST_EXPORT, 2, 0x7f0000001234ull);
        frame(5, 3, 0x7f0000002345ull);
        frame(ST_CONSUME, 5, 0x7f0000002400ull);
        frame(ST_DELETE, 3, 0x7f0000003456ull);
        frame(ST_DESTROY, 1, CS_FRAME_PY_VALUE(1, 31, 1));
        frame(9, 1, CS_FRAME_PY_VALUE(3, 50, 0));
        frame(ST_ALLOC, 9, 0x7f0000004567ull);
        frame(ST_FREE, 9, 0x7f0000004600ull);
        frame(ST_LEAK_EXPORT, 1, CS_FRAME_PY_VALUE(4, 66, 0));
        frame(ST_LEAK_ALLOC, 1, CS_FRAME_PY_VALUE(4, 70, 0));
    }

    const uint64_t tensor_base = 0x55aa00000000ull, capsule_base = 0x7fee00000000ull,
                   data_base = 0x7fdd00000000ull, deleter = 0x7f0000005000ull;
    uint64_t cycle = 0, findings = 0, leaks = 0, leaked_bytes = 0, next_finding = FINDING_EVERY / 2;
    uint64_t live_dl = 0, live_np = 0, live_np_bytes = 0, next_counts = 0;
    while (n_written < target) {
        uint64_t slot = unique ? cycle : cycle % POOL;
        uint64_t t = tensor_base + slot * 64, cap = capsule_base + slot * 64,
                 data = data_base + slot * 4096;
        uint32_t th = 1 + (uint32_t)(cycle & 1);
        uint64_t nb = 64 + (cycle % 7) * 64;
        if (n_written >= next_counts) {
            cs_rec_counts c = {.time_ns = now_ns(), .events = n_written, .live_dlpack = live_dl,
                               .live_dlpack_bytes = live_dl * 256, .live_numpy = live_np,
                               .live_numpy_bytes = live_np_bytes};
            rec(CS_REC_COUNTS, &c, sizeof c);
            next_counts += COUNTS_EVERY;
        }
        if (n_written >= next_finding) {
            /* a double delete, a DLPack leak and a NumPy leak, on fresh
             * addresses outside the pool */
            uint64_t k = findings / 3;
            uint64_t bt = tensor_base + 0x100000000ull + k * 64;
            event(CS_EV_EXPORT, bt, capsule_base + 0x100000000ull + k * 64, deleter, 800,
                  ST_EXPORT, 1);
            event(CS_EV_CONSUME, bt, capsule_base + 0x100000000ull + k * 64, 0, 0, ST_CONSUME, 1);
            event(CS_EV_DELETE, bt, 0, 0, 0, ST_DELETE, 1);
            event(CS_EV_DELETE, bt, 0, 0, 0, ST_DELETE, 1);
            uint64_t lt = tensor_base + 0x200000000ull + k * 64;
            event(CS_EV_EXPORT, lt, capsule_base + 0x200000000ull + k * 64, deleter, 4096,
                  ST_LEAK_EXPORT, 1);
            event(CS_EV_CONSUME, lt, capsule_base + 0x200000000ull + k * 64, 0, 0, ST_CONSUME, 1);
            event(CS_EV_NP_ALLOC, data_base + 0x100000000ull + k * 4096, 1000 + k, 0, 0,
                  ST_LEAK_ALLOC, 1);
            findings += 3;
            leaks += 2;
            leaked_bytes += 4096 + 1000 + k;
            live_dl++;
            live_np++;
            live_np_bytes += 1000 + k;
            next_finding += FINDING_EVERY;
            continue;
        }
        /* one cycle: 4 DLPack events and 2 NumPy events */
        event(CS_EV_NP_ALLOC, data, nb, 0, 0, ST_ALLOC, th);
        event(CS_EV_EXPORT, t, cap, deleter, nb, ST_EXPORT, th);
        event(CS_EV_CONSUME, t, cap, 0, 0, ST_CONSUME, th);
        event(CS_EV_DELETE, t, 0, 0, 0, ST_DELETE, th);
        event(CS_EV_DESTROY, t, cap, 0, 0, ST_DESTROY, th);
        event(CS_EV_NP_FREE, data, nb, 0, 0, ST_FREE, th);
        cycle++;
    }
    cs_rec_counts c = {.time_ns = now_ns(), .events = n_written, .live_dlpack = live_dl,
                       .live_dlpack_bytes = live_dl * 256, .live_numpy = live_np,
                       .live_numpy_bytes = live_np_bytes};
    rec(CS_REC_COUNTS, &c, sizeof c);
    cs_rec_end e = {.how = CS_END_EXIT, .status = 0, .time_ns = now_ns(), .events = n_written};
    rec(CS_REC_END, &e, sizeof e);
    if (fclose(out) != 0) {
        perror(argv[1]);
        return 1;
    }
    printf("events=%llu findings=%llu leaks=%llu leaked_bytes=%llu\n",
           (unsigned long long)n_written, (unsigned long long)findings,
           (unsigned long long)leaks, (unsigned long long)leaked_bytes);
    return 0;
}
