/* Stack merging and LeakSanitizer-style text rendering (render.h).
 *
 * Also linked into libcapsan.so, so it stays a good guest: no stdio
 * streams, no allocation, no locks; output goes through the cs_out sink
 * and stack buffers are bounded. */
#include "render.h"
#include "leakgroups.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

/* frames rendered per event: enough for 16 native frames with inlines and
 * a deep Python stack, while keeping the stack use of a report small */
#define RENDER_MAX_FRAMES 128
#define NATIVE_MAX 16
#define EVAL_FUNCTION "_PyEval_EvalFrameDefault"

#define COLOR_ERROR "\033[1m\033[31m"
#define COLOR_WARNING "\033[1m\033[35m"
#define COLOR_RESET "\033[0m"

void cs_outf(cs_out *o, const char *fmt, ...)
{
    char buf[1024];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    if (n < 0)
        return;
    /* long strings go through out_str(); a cut here only loses the tail */
    o->write(o->ud, buf, (size_t)n < sizeof buf ? (size_t)n : sizeof buf - 1);
}

static void out_str(cs_out *o, const char *s)
{
    if (s)
        o->write(o->ud, s, strlen(s));
}

void cs_out_char(cs_out *o, unsigned char ch)
{
    if (ch < 0x20 || ch == 0x7f)
        cs_outf(o, "\\x%02x", ch);
    else
        o->write(o->ud, (const char *)&ch, 1);
}

/* a name from the traced process (file, function, module): its control
 * bytes are shown, never sent to the terminal */
static void out_name(cs_out *o, const char *s)
{
    for (; s && *s; s++)
        cs_out_char(o, (unsigned char)*s);
}

static char strip_prefix[256];

void cs_render_strip_prefix(const char *prefix)
{
    snprintf(strip_prefix, sizeof strip_prefix, "%s", prefix ? prefix : "");
}

static const char *stripped(const char *path)
{
    const char *at = strip_prefix[0] && path ? strstr(path, strip_prefix) : NULL;
    return at && at[strlen(strip_prefix)] ? at + strlen(strip_prefix) : path;
}

static const char *base_name(const char *path)
{
    const char *s = path ? strrchr(path, '/') : NULL;
    return s ? s + 1 : path;
}

/* ---- stack merging ---------------------------------------------------- */

static void python_frame(const cs_stack_source *src, uint64_t v, cs_frame_info *f)
{
    const char *file = NULL, *name = NULL;
    memset(f, 0, sizeof *f);
    f->python = 1;
    if (src->code && src->code(src->ud, CS_FRAME_PY_CODE(v), &file, &name)) {
        f->file = file;
        f->function = name;
    }
    f->line = CS_FRAME_PY_LINE(v);
}

static int is_eval_frame(const cs_frame_info *nf, int k)
{
    for (int i = 0; i < k; i++)
        if (nf[i].function && strcmp(nf[i].function, EVAL_FUNCTION) == 0)
            return 1;
    return 0;
}

int cs_stack_frames(const cs_stack_source *src, uint32_t stack,
                    cs_frame_info *out, int max)
{
    uint64_t raw[CS_MAX_FRAMES];
    int nraw = (stack && src->raw) ? src->raw(src->ud, stack, raw, CS_MAX_FRAMES) : 0;
    if (nraw < 0)
        nraw = 0;
    if (nraw > CS_MAX_FRAMES)
        nraw = CS_MAX_FRAMES;

    int nnative = 0;
    while (nnative < nraw && !CS_FRAME_IS_PY(raw[nnative]))
        nnative++;
    int py = nnative;               /* next Python frame to place */
    int n = 0;

    for (int i = 0; i < nnative && n < max; i++) {
        cs_frame_info nf[NATIVE_MAX];
        int k = src->native ? src->native(src->ud, raw[i], nf, NATIVE_MAX) : 0;
        if (k <= 0) {
            memset(nf, 0, sizeof nf[0]);
            nf[0].address = raw[i];
            k = 1;
        }
        if (k > NATIVE_MAX)
            k = NATIVE_MAX;
        if (py < nraw && is_eval_frame(nf, k)) {
            /* this C-level evaluation ran the Python frames up to and
             * including the next entry frame */
            while (py < nraw && n < max) {
                uint64_t v = raw[py++];
                if (!CS_FRAME_IS_PY(v))
                    continue;       /* a native value among Python ones: corrupt */
                python_frame(src, v, &out[n++]);
                if (CS_FRAME_PY_IS_ENTRY(v))
                    break;
            }
            continue;
        }
        for (int j = 0; j < k && n < max; j++)
            out[n++] = nf[j];
    }
    /* Python frames whose evaluation loop is beyond the native depth */
    while (py < nraw && n < max) {
        uint64_t v = raw[py++];
        if (CS_FRAME_IS_PY(v))
            python_frame(src, v, &out[n++]);
    }
    return n;
}

int cs_stack_python_top(const cs_stack_source *src, uint32_t stack, cs_frame_info *out)
{
    uint64_t raw[CS_MAX_FRAMES];
    int nraw = (stack && src->raw) ? src->raw(src->ud, stack, raw, CS_MAX_FRAMES) : 0;
    if (nraw > CS_MAX_FRAMES)
        nraw = CS_MAX_FRAMES;
    for (int i = 0; i < nraw; i++)
        if (CS_FRAME_IS_PY(raw[i])) {
            python_frame(src, raw[i], out);
            return 1;
        }
    return 0;
}

/* ---- text ------------------------------------------------------------- */

static void render_frame(cs_out *o, int k, const cs_frame_info *f)
{
    if (f->python) {
        cs_outf(o, "    #%d ", k);
        out_name(o, f->file ? stripped(f->file) : "<unknown>");
        if (f->line)
            cs_outf(o, ":%u", f->line);
        out_str(o, " in ");
        out_name(o, f->function ? f->function : "<unknown>");
        out_str(o, "\n");
        return;
    }
    cs_outf(o, "    #%d 0x%llx", k, (unsigned long long)f->address);
    if (f->function) {
        out_str(o, " in ");
        out_name(o, f->function);
        if (f->file) {
            out_str(o, " ");
            out_name(o, stripped(f->file));
            if (f->line)
                cs_outf(o, ":%u", f->line);
        } else if (f->module) {
            out_str(o, " (");
            out_name(o, base_name(f->module));
            cs_outf(o, "+0x%llx)", (unsigned long long)f->offset);
        }
    } else if (f->module) {
        /* the full path and build id let offline tools finish the job */
        out_str(o, " (");
        out_name(o, stripped(f->module));
        cs_outf(o, "+0x%llx)", (unsigned long long)f->offset);
        if (f->build_id) {
            out_str(o, " (BuildId: ");
            out_name(o, f->build_id); /* a saved report's is read from a file */
            out_str(o, ")");
        }
    } else {
        out_str(o, " (<unknown module>)");
    }
    out_str(o, "\n");
}

void cs_render_text_frame(cs_out *o, int k, const cs_frame_info *f) { render_frame(o, k, f); }

static uint64_t fnv(uint64_t h, const char *s)
{
    for (; s && *s; s++)
        h = (h ^ (unsigned char)*s) * 1099511628211ull;
    return (h ^ 0xff) * 1099511628211ull;
}

uint64_t cs_stack_display_key(const cs_stack_source *src, uint32_t stack)
{
    cs_frame_info fr[64];
    int n = src ? cs_stack_frames(src, stack, fr, 64) : 0;
    if (!n)
        return stack;
    uint64_t h = 1469598103934665603ull;
    for (int k = 0; k < n; k++) {
        const char *b = base_name(fr[k].module);
        if (!fr[k].python && b && (!strncmp(b, "python", 6) || !strncmp(b, "libpython", 9)))
            continue;
        h = fnv(h, fr[k].python ? "py" : b);
        h = fnv(h, fr[k].file);
        h = fnv(h, fr[k].function);
        h = (h ^ fr[k].line) * 1099511628211ull;
        if (!fr[k].python && !fr[k].function)
            h = (h ^ fr[k].offset) * 1099511628211ull;
    }
    return h;
}

static void render_header(cs_out *o, const cs_proc_info *p, const cs_finding *f)
{
    int error = cs_finding_severity(f) != CS_SEV_WARNING;
    const char *kind = cs_kind_name(f->kind);
    out_str(o, "=================================================================\n");
    cs_outf(o, "==%llu==", (unsigned long long)p->pid);
    if (o->color)
        out_str(o, error ? COLOR_ERROR : COLOR_WARNING);
    out_str(o, error ? "ERROR: capsan: " : "WARNING: capsan: ");
    out_str(o, kind ? kind : "unknown");
    out_str(o, ": ");
}

static void render_stack(cs_out *o, const cs_stack_source *src, uint32_t stack)
{
    cs_frame_info frames[RENDER_MAX_FRAMES];
    int n = src ? cs_stack_frames(src, stack, frames, RENDER_MAX_FRAMES) : 0;
    if (n == 0)
        out_str(o, "    <no stack recorded>\n");
    for (int k = 0; k < n; k++)
        render_frame(o, k, &frames[k]);
}

/* An Arrow struct first met at an import (R49): the library its release
 * callback lies in is its producer */
static void render_producer(cs_out *o, const cs_stack_source *src, uint64_t release)
{
    cs_frame_info fr[8];
    int n = src->native(src->ud, release + 1, fr, 8); /* an exact address, not a return one */
    if (n <= 0)
        return;
    const cs_frame_info *f = &fr[n - 1];
    const char *mod = f->module ? strrchr(f->module, '/') : NULL;
    cs_outf(o, "    its producer: %s (its release callback %s at 0x%llx)\n",
            mod ? mod + 1 : f->module ? f->module : "an unknown object",
            f->function ? f->function : "", (unsigned long long)release);
}

static void render_events(cs_out *o, const cs_finding *f, int from, const cs_stack_source *src)
{
    int nev = f->nevents < CS_FINDING_MAX_EVENTS ? f->nevents : CS_FINDING_MAX_EVENTS;
    for (int i = from; i < nev; i++) {
        const cs_event *ev = &f->events[i];
        const char *phrase = cs_event_phrase(f, i);
        if ((ev->kind == CS_EV_REACHABLE || ev->kind == CS_EV_NP_REACHABLE) && ev->a) {
            /* the scan's word: no thread, no stack; where it lies says
             * whether it can be a real reference (an object's field) or
             * a stale copy (freed memory, a block's unused tail) */
            const char *where = cs_where_text(ev->aux);
            cs_outf(o, "  still referenced at the end: its address is stored at 0x%llx%s%s\n",
                    (unsigned long long)ev->a, where ? ", in " : "", where ? where : "");
            continue;
        }
        out_str(o, "  ");
        if (phrase) {
            out_str(o, phrase);
        } else {
            out_str(o, cs_event_name(ev));
            out_str(o, " at");
        }
        cs_outf(o, " (thread T%u):\n", ev->thread);
        render_stack(o, src, ev->stack);
        if (ev->kind == CS_EV_AR_EXPORT && (ev->aux & CS_AR_FOUND) && ev->c && src &&
            src->native)
            render_producer(o, src, ev->c);
    }
}

/* LeakSanitizer's "Indirect leak of N byte(s) in M object(s) allocated
 * from:", with the stack of the first of them */
static void render_indirect(cs_out *o, const cs_finding *f, unsigned count, uint64_t bytes,
                            const cs_stack_source *src)
{
    if (!count)
        return;
    cs_outf(o, "Indirect leak of %llu byte(s) in %u object(s) allocated from:\n",
            (unsigned long long)bytes, count);
    if (f->nindirect)
        render_stack(o, src, f->indirect[0].alloc.stack);
    out_str(o, f->kind == CS_KIND_ARROW_LEAK
                   ? "  kept alive by the unreleased stream above (its producer shares the array's "
                     "memory)\n"
                   : "  kept alive by the leaked tensor above (its manager_ctx holds the array)\n");
}

void cs_render_text_finding(cs_out *o, const cs_proc_info *p,
                            const cs_finding *f, const cs_stack_source *src)
{
    char msg[512];
    render_header(o, p, f);
    out_str(o, cs_finding_message(f, msg, sizeof msg));
    if (o->color)
        out_str(o, COLOR_RESET);
    out_str(o, "\n");
    render_events(o, f, 0, src);
    render_indirect(o, f, f->nindirect, f->indirect_bytes, src);
    out_str(o, "\n");
}

void cs_render_text_leak_group(cs_out *o, const cs_proc_info *p, const cs_leak_group *g,
                               const cs_stack_source *src)
{
    const cs_finding *first = &g->first;
    unsigned count = g->count;
    uint64_t bytes = g->bytes;
    char msg[512];
    render_header(o, p, first);
    /* LeakSanitizer's words for a leak; what was live at the end otherwise */
    const char *head = "Direct leak of %llu byte(s) in %u object(s) ";
    if (first->kind == CS_KIND_LIVE_AT_EXIT)
        head = first->detail == CS_LIVE_KILLED ? "Live when killed: %llu byte(s) in %u object(s) "
                                               : "Live at _exit: %llu byte(s) in %u object(s) ";
    else if (cs_finding_severity(first) == CS_SEV_WARNING)
        head = "Unreleased when killed: %llu byte(s) in %u object(s) ";
    cs_outf(o, head, (unsigned long long)bytes, count);
    /* "exported at" -> "exported from:", as LeakSanitizer's "allocated from:" */
    const char *phrase = first->nevents ? cs_event_phrase(first, 0) : NULL;
    size_t pl = phrase ? strlen(phrase) : 0;
    if (pl > 3 && strcmp(phrase + pl - 3, " at") == 0) {
        o->write(o->ud, phrase, pl - 3);
        out_str(o, " from:");
    } else {
        out_str(o, "allocated from:");
    }
    if (o->color)
        out_str(o, COLOR_RESET);
    out_str(o, "\n");
    if (first->nevents)
        render_stack(o, src, first->events[0].stack);
    out_str(o, count > 1 ? "  the first of them: " : "  ");
    out_str(o, cs_finding_message(first, msg, sizeof msg));
    out_str(o, "\n");
    render_events(o, first, 1, src);
    render_indirect(o, first, g->ind_count, g->ind_bytes, src);
    out_str(o, "\n");
}

void cs_render_text_omitted(cs_out *o, uint64_t pid, unsigned n, long max_findings)
{
    if (!n)
        return;
    if (pid)
        cs_outf(o, "==%llu==capsan: ", (unsigned long long)pid);
    cs_outf(o, "Omitting %u more finding(s). (max_findings=%ld)\n", n, max_findings);
}

int cs_kind_is_leak(int kind)
{
    const char *name = cs_kind_name(kind);
    size_t n = name ? strlen(name) : 0;
    return n >= 5 && strcmp(name + n - 5, "-leak") == 0;
}

int cs_kind_is_grouped(int kind)
{
    return cs_kind_is_leak(kind) || kind == CS_KIND_LIVE_AT_EXIT;
}

void cs_summary_add(cs_summary *s, const cs_finding *f)
{
    if (cs_finding_severity(f) == CS_SEV_WARNING)
        s->warnings++;
    else
        s->errors++;
    if (f->kind < CS_KIND_COUNT)
        s->per_kind[f->kind]++;
    if (cs_kind_is_leak(f->kind) && cs_finding_severity(f) == CS_SEV_ERROR) {
        s->leaked_bytes += f->bytes;
        s->leak_objects++;
        s->indirect_bytes += f->indirect_bytes;
        s->indirect_objects += f->nindirect;
    }
}

void cs_render_text_summary(cs_out *o, const cs_proc_info *p, const cs_summary *s)
{
    (void)p;                        /* one line per process; the header names it */
    cs_outf(o, "SUMMARY: capsan: %u error(s), %u warning(s)", s->errors, s->warnings);
    int first = 1;
    for (int k = 1; k < CS_KIND_COUNT; k++) {
        if (!s->per_kind[k])
            continue;
        out_str(o, first ? " [" : ", ");
        out_str(o, cs_kind_name(k));
        cs_outf(o, ": %u", s->per_kind[k]);
        first = 0;
    }
    if (!first)
        out_str(o, "]");
    cs_outf(o, "; %llu byte(s) leaked in %u object(s)",
            (unsigned long long)s->leaked_bytes, s->leak_objects);
    if (s->indirect_objects)
        cs_outf(o, ", and %llu indirectly in %u", (unsigned long long)s->indirect_bytes,
                s->indirect_objects);
    out_str(o, ".");
    if (s->suppressed)
        cs_outf(o, " %u suppressed.", s->suppressed);
    if (s->first[0]) {
        out_str(o, " First: ");
        out_name(o, s->first);
        out_str(o, ".");
    }
    out_str(o, "\n");
}

void cs_summary_locate(cs_summary *s, const cs_finding *f, const cs_stack_source *src)
{
    if (s->first[0] || cs_finding_severity(f) != CS_SEV_ERROR || !src)
        return;
    int nev = f->nevents < CS_FINDING_MAX_EVENTS ? f->nevents : CS_FINDING_MAX_EVENTS;
    for (int e = nev - 1; e >= 0; e--) {
        cs_frame_info fr;
        if (!cs_stack_python_top(src, f->events[e].stack, &fr) || !fr.file)
            continue;
        snprintf(s->first, sizeof s->first, "%s at %s:%u in %s", cs_kind_name(f->kind),
                 stripped(fr.file), fr.line, fr.function ? fr.function : "<unknown>");
        return;
    }
    snprintf(s->first, sizeof s->first, "%s", cs_kind_name(f->kind));
}
