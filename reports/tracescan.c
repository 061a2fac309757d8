/* The one pass over a trace's records: the framing of each (header, size,
 * alignment, the end-of-data marker, records reserved but never committed,
 * data left after the end), EVENT records the short way to the judge, the
 * rest to their parsers. The first record that does not fit stops the pass
 * with a message naming its offset; what came before stays usable. Also
 * the second pass that judges the events again. */
#include "reader_int.h"

#include <stdio.h>
#include <string.h>
#include <sys/mman.h>

/* Drop pages behind the cursor every so often: the mapping is clean and
 * file-backed, so this only keeps the resident size flat on huge traces. */
#define CS_RELEASE_CHUNK (16u << 20)

static const char *rec_type_name(unsigned type)
{
    switch (type) {
    case CS_REC_PAD: return "PAD";
    case CS_REC_PROCESS: return "PROCESS";
    case CS_REC_MODULE: return "MODULE";
    case CS_REC_CODE: return "CODE";
    case CS_REC_FRAME: return "FRAME";
    case CS_REC_EVENT: return "EVENT";
    case CS_REC_THREAD: return "THREAD";
    case CS_REC_END: return "END";
    case CS_REC_OPTIONS: return "OPTIONS";
    case CS_REC_COUNTS: return "COUNTS";
    case CS_REC_LIVE: return "LIVE";
    case CS_REC_CRASH: return "CRASH";
    default: return "unknown";
    }
}

static void corrupt(cs_trace *t, uint64_t off, const char *why)
{
    t->error = 1;
    t->data_end = off;
    snprintf(t->errmsg, sizeof t->errmsg,
             "%s: corrupt record at offset 0x%llx (%s); the rest of the file is ignored",
             t->path, (unsigned long long)off, why);
}

static void release_behind(const struct cs_trace_priv *p, uint64_t off, uint64_t *released)
{
    if (off - *released < CS_RELEASE_CHUNK)
        return;
    uint64_t upto = off & ~((uint64_t)CS_RELEASE_CHUNK - 1);
    if (upto > *released) {
        madvise((void *)(p->map + *released), upto - *released, MADV_DONTNEED);
        *released = upto;
    }
}

/* The one pass: validate the framing of every record, load the tables and
 * judge the events. EVENT records are most of a trace and take the short
 * way through the loop. */
void trace_scan(cs_trace *t)
{
    struct cs_trace_priv *p = t->priv;
    uint64_t off = t->hdr.header_size, released = 0;
    const uint64_t size = p->size;
    char why[160];

    t->data_end = off;
    while (off < size) {
        if (size - off < sizeof(cs_rec)) {
            /* a partial header at the very end: zeros are a clean end */
            for (uint64_t i = off; i < size; i++)
                if (p->map[i]) {
                    corrupt(t, off, "partial record header at end of file");
                    return;
                }
            break;
        }
        cs_rec r;
        memcpy(&r, p->map + off, sizeof r);
        if (r.type == CS_REC_EVENT && r.size == sizeof r + sizeof(cs_event) &&
            r.size <= size - off) {
            cs_event ev;
            memcpy(&ev, p->map + off + sizeof r, sizeof ev);
            t->nevents++;
            if (p->lc)
                trace_judge(t, &ev);
            t->nrecords++;
            off += r.size;
            t->data_end = off;
            if ((off & (CS_RELEASE_CHUNK - 1)) < r.size)
                release_behind(p, off, &released);
            continue;
        }
        if (r.type == CS_REC_END_OF_DATA && r.size == 0 && r.flags == 0) {
            /* the end of what was written; note data beyond it, which
             * only a writer killed between reserving and finishing a
             * record leaves behind */
            for (uint64_t i = off; i < size; i++)
                if (p->map[i]) {
                    t->trailing_offset = i & ~(uint64_t)7;
                    break;
                }
            break;
        }
        if (r.size < sizeof r) {
            snprintf(why, sizeof why, "type %u (%s), size %u < 8", r.type,
                     rec_type_name(r.type), r.size);
            corrupt(t, off, why);
            return;
        }
        if (r.size % 8) {
            snprintf(why, sizeof why, "type %u (%s), size %u not a multiple of 8",
                     r.type, rec_type_name(r.type), r.size);
            corrupt(t, off, why);
            return;
        }
        if (r.size > size - off) {
            snprintf(why, sizeof why, "type %u (%s), size %u runs past the end of the file at 0x%llx",
                     r.type, rec_type_name(r.type), r.size, (unsigned long long)size);
            corrupt(t, off, why);
            return;
        }
        if (r.type == CS_REC_END_OF_DATA) {
            /* the writer stores the type last: a sized record without one
             * was reserved but never committed (its thread was killed or
             * is still writing); records after it are whole, keep going */
            t->nuncommitted++;
            off += r.size;
            t->data_end = off;
            continue;
        }
        const char *bad = trace_parse_record(t, r.type, p->map + off + sizeof r,
                                             r.size - sizeof r, off);
        if (bad) {
            corrupt(t, off, bad);
            return;
        }
        t->nrecords++;
        off += r.size;
        t->data_end = off;
        release_behind(p, off, &released);
    }
}

/* Judge the events again with the final protect setting: only needed when
 * an OPTIONS record came after events (the writer puts it first). */
void trace_rejudge(cs_trace *t)
{
    struct cs_trace_priv *p = t->priv;
    uint64_t off = t->hdr.header_size, released = 0;
    while (off + sizeof(cs_rec) <= t->data_end) {
        cs_rec r;
        memcpy(&r, p->map + off, sizeof r);
        if (r.size < sizeof r || r.size > t->data_end - off)
            break;                  /* cannot happen after trace_scan(); be safe */
        if (r.type == CS_REC_EVENT && r.size >= sizeof r + sizeof(cs_event)) {
            cs_event ev;
            memcpy(&ev, p->map + off + sizeof r, sizeof ev);
            trace_judge(t, &ev);
        }
        off += r.size;
        release_behind(p, off, &released);
    }
}
