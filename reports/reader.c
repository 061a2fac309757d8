/* Trace file reader: see reader.h for the one-pass design, reader_int.h
 * for its files and reports/FORMAT.md for the format. This one opens a
 * trace (a file that is not a capsan trace, or of an unknown version, is
 * refused with the offset of what is wrong), runs the pass and the
 * lifecycle's end over it, and frees it all. A damaged record later on is
 * not fatal: a report from a damaged trace beats no report. */
#include "reader_int.h"
#include "util.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

cs_trace *cs_trace_open(const char *path, char *err, size_t errlen)
{
    /* O_NONBLOCK: a FIFO given by mistake must not hang the report */
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0) {
        snprintf(err, errlen, "%s: cannot open: %s", path, strerror(errno));
        return NULL;
    }
    struct stat st;
    if (fstat(fd, &st) == 0 && S_ISDIR(st.st_mode)) {
        snprintf(err, errlen, "%s: is a directory, not a trace file (name the traces in it, "
                 "e.g. %s/capsan.trace.*)", path, path);
        close(fd);
        return NULL;
    }
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        snprintf(err, errlen, "%s: not a regular file", path);
        close(fd);
        return NULL;
    }
    if ((uint64_t)st.st_size < sizeof(cs_file_header)) {
        snprintf(err, errlen, "%s: not a capsan trace: %lld bytes, shorter than the "
                 "%zu-byte header at offset 0x0", path, (long long)st.st_size,
                 sizeof(cs_file_header));
        close(fd);
        return NULL;
    }
    size_t size = (size_t)st.st_size;
    const uint8_t *map = mmap(NULL, size, PROT_READ, MAP_PRIVATE, fd, 0);
    close(fd);
    if (map == MAP_FAILED) {
        snprintf(err, errlen, "%s: cannot map: %s", path, strerror(errno));
        return NULL;
    }
    madvise((void *)map, size, MADV_SEQUENTIAL);

    cs_file_header h;
    memcpy(&h, map, sizeof h);
    const char *bad = NULL;
    unsigned long long at = 0;
    if (memcmp(h.magic, CS_TRACE_MAGIC, 8) != 0) {
        bad = "bad magic (expected \"" CS_TRACE_MAGIC "\")";
        at = offsetof(cs_file_header, magic);
    } else if (h.version < 1 || h.version > CS_TRACE_VERSION) {
        snprintf(err, errlen, "%s: unsupported trace format version %u at offset 0x%zx "
                 "(this capsan reads versions 1 to %u)", path, h.version,
                 offsetof(cs_file_header, version), CS_TRACE_VERSION);
        munmap((void *)map, size);
        return NULL;
    } else if (h.header_size < sizeof h || h.header_size % 8 || h.header_size > size) {
        bad = "bad header size";
        at = offsetof(cs_file_header, header_size);
    }
    if (bad) {
        snprintf(err, errlen, "%s: not a capsan trace: %s at offset 0x%llx", path, bad, at);
        munmap((void *)map, size);
        return NULL;
    }

    cs_trace *t = cs_xrealloc(NULL, sizeof *t);
    memset(t, 0, sizeof *t);
    t->priv = cs_xrealloc(NULL, sizeof *t->priv);
    memset(t->priv, 0, sizeof *t->priv);
    struct cs_trace_priv *p = t->priv;
    p->map = map;
    p->size = size;
    t->path = cs_xstrndup(path, strlen(path));
    t->hdr = h;
    t->opt_max_findings = -1;
    t->counts_stride = 1;
    p->lc = cs_lc_create(trace_store_finding, t, 0);
    if (p->lc) /* a forked child's inheritance is its parent's to judge */
        cs_lc_set_born(p->lc, h.start_mono_ns);
    trace_scan(t);
    if (p->lc && p->rereplay) {
        cs_lc_destroy(p->lc);
        trace_findings_clear(t);
        if ((p->lc = cs_lc_create(trace_store_finding, t, 0))) {
            cs_lc_set_protect(p->lc, p->protect);
            cs_lc_set_born(p->lc, h.start_mono_ns);
            trace_rejudge(t);
        }
    }
    if (p->lc) {
        /* killed (no END), or a fatal signal: no leak verdict, but what it
         * held, from its live state */
        if (!t->has_end || t->end.how == CS_END_SIGNAL)
            cs_lc_finish_killed(p->lc, p->live, p->nlive);
        cs_lc_finish(p->lc, t->has_end ? (int)t->end.how : CS_END_UNKNOWN);
        cs_lc_destroy(p->lc);
        p->lc = NULL;
    }
    trace_counts_finish(t);
    /* the tables hold what the report needs: let the file go */
    munmap((void *)p->map, p->size);
    p->map = NULL;
    return t;
}

void cs_trace_close(cs_trace *t)
{
    if (!t)
        return;
    struct cs_trace_priv *p = t->priv;
    if (p->map)
        munmap((void *)p->map, p->size);
    free(p->frames);
    for (size_t i = 0; i < p->ncodes; i++) {
        free(p->codes[i].file);
        free(p->codes[i].name);
    }
    free(p->codes);
    free(p->code_index);
    free(p->fmem);
    free(p->live);
    if (p->spill)
        fclose(p->spill);
    if (p->lc)
        cs_lc_destroy(p->lc);
    free(p);
    free(t->counts);
    if (t->argv)
        for (unsigned i = 0; i < t->argc; i++)
            free(t->argv[i]);
    free(t->argv);
    free(t->exe);
    free(t->options);
    free(t->opt_suppressions);
    free(t->opt_strip_prefix);
    trace_crash_free(t);
    for (size_t i = 0; i < t->nmodules; i++) {
        free(t->modules[i].build_id);
        free(t->modules[i].path);
    }
    free(t->modules);
    for (size_t i = 0; i < t->nthreads; i++)
        free(t->threads[i].name);
    free(t->threads);
    free(t->path);
    free(t);
}
