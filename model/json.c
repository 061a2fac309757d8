/* JSON report writer (json.h). Field names and types are a contract
 * (DESIGN.md): tests and users' tools read them, so extra fields may be
 * added but none renamed. Unknown strings are "" and unknown lines 0, so
 * that consumers can treat every field as always present. */
#include "json.h"
#include "utf8.h"

#include <string.h>

#define JSON_MAX_FRAMES 128

/* Escaped output is staged in a small buffer to avoid a sink call per byte. */
typedef struct jbuf {
    cs_out *o;
    size_t n;
    char b[256];
} jbuf;

static void jflush(jbuf *j)
{
    if (j->n)
        j->o->write(j->o->ud, j->b, j->n);
    j->n = 0;
}

static void jput(jbuf *j, const char *s, size_t n)
{
    if (j->n + n > sizeof j->b)
        jflush(j);
    memcpy(j->b + j->n, s, n);
    j->n += n;
}


void cs_json_string(cs_out *o, const char *str)
{
    if (!str) {
        o->write(o->ud, "null", 4);
        return;
    }
    static const char hex[] = "0123456789abcdef";
    jbuf j = { .o = o };
    const unsigned char *s = (const unsigned char *)str;
    size_t left = strlen(str);
    jput(&j, "\"", 1);
    while (left) {
        unsigned c = *s;
        if (c == '"' || c == '\\') {
            char e[2] = { '\\', (char)c };
            jput(&j, e, 2);
        } else if (c == '\n') {
            jput(&j, "\\n", 2);
        } else if (c == '\t') {
            jput(&j, "\\t", 2);
        } else if (c == '\r') {
            jput(&j, "\\r", 2);
        } else if (c < 0x20 || c == 0x7f) {
            char e[6] = { '\\', 'u', '0', '0', hex[c >> 4], hex[c & 15] };
            jput(&j, e, 6);
        } else {
            size_t n = cs_utf8_len(s, left);
            if (n == 0) {
                jput(&j, "\\ufffd", 6);
                n = 1;
            } else {
                jput(&j, (const char *)s, n);
            }
            s += n;
            left -= n;
            continue;
        }
        s++;
        left--;
    }
    jput(&j, "\"", 1);
    jflush(&j);
}

static void str_or_empty(cs_out *o, const char *s)
{
    cs_json_string(o, s ? s : "");
}

static const char *base_name(const char *path)
{
    const char *s = path ? strrchr(path, '/') : NULL;
    return s ? s + 1 : path;
}

void cs_json_begin(cs_json *j, cs_out *o)
{
    memset(j, 0, sizeof *j);
    j->o = o;
    cs_outf(o, "{\"tool\": \"capsan\", \"format\": 1, \"processes\": [");
}

static const char *ended_name(int how)
{
    switch (how) {
    case CS_END_EXIT:
    case CS_END_API_EXIT:           /* no leak verdict at exit: API mode judged in scopes */
    case CS_END_STOPPED_EXIT:       /* nor after capsan.stop() */
    case CS_END_HALT:               /* halt_on_error exits the process */
        return "exit";
    case CS_END_QUICK_EXIT:         /* _exit(): leaks judged by reachability */
        return "_exit";
    case CS_END_SIGNAL:
        return "signal";
    default:
        return "unknown";
    }
}

static void json_frame(cs_out *o, const cs_frame_info *f);

void cs_json_process_begin(cs_json *j, const cs_json_proc *p)
{
    cs_out *o = j->o;
    const cs_proc_info *pi = p->info;
    cs_outf(o, "%s\n {\"pid\": %llu, \"ppid\": %llu, \"argv\": [", j->nproc ? "," : "",
            (unsigned long long)pi->pid, (unsigned long long)pi->ppid);
    for (unsigned i = 0; i < p->argc; i++) {
        if (i)
            cs_outf(o, ", ");
        str_or_empty(o, p->argv[i]);
    }
    cs_outf(o, "], \"exe\": ");
    str_or_empty(o, p->exe);
    cs_outf(o, ", \"ended\": \"%s\", \"status\": %d, \"halted\": %s",
            ended_name(pi->ended), pi->status, pi->ended == CS_END_HALT ? "true" : "false");
    if (p->end_time_ns && p->end_time_ns >= pi->start_mono_ns)
        cs_outf(o, ", \"duration_ns\": %llu",
                (unsigned long long)(p->end_time_ns - pi->start_mono_ns));
    if (p->parent_pid)
        cs_outf(o, ", \"parent\": %llu", (unsigned long long)p->parent_pid);
    if (p->counts_records) {
        /* the live-object series behind the HTML plot: times relative to
         * the process start, like event times */
        cs_outf(o, ",\n  \"counts\": {\"records\": %llu, \"stride\": %llu, \"fields\": "
                "[\"time_ns\", \"events\", \"live_dlpack\", \"live_dlpack_bytes\", \"live_numpy\", "
                "\"live_numpy_bytes\"], \"points\": [",
                (unsigned long long)p->counts_records, (unsigned long long)p->counts_stride);
        for (size_t i = 0; i < p->ncounts; i++) {
            const cs_rec_counts *c = &p->counts[i];
            uint64_t t = c->time_ns;
            if (pi->start_mono_ns && t >= pi->start_mono_ns)
                t -= pi->start_mono_ns;
            cs_outf(o, "%s[%llu, %llu, %llu, %llu, %llu, %llu]", i ? ", " : "",
                    (unsigned long long)t, (unsigned long long)c->events,
                    (unsigned long long)c->live_dlpack, (unsigned long long)c->live_dlpack_bytes,
                    (unsigned long long)c->live_numpy, (unsigned long long)c->live_numpy_bytes);
        }
        cs_outf(o, "]}");
    }
    if (p->ncrash > 0) {
        cs_outf(o, ",\n  \"crash\": {\"thread\": %llu, \"stack\": [",
                (unsigned long long)p->crash_tid);
        for (int i = 0; i < p->ncrash; i++) {
            if (i)
                cs_outf(o, ", ");
            json_frame(o, &p->crash[i]);
        }
        cs_outf(o, "]}");
    }
    cs_outf(o, ", \"trace\": ");
    cs_json_string(o, p->trace);
    cs_outf(o, ", \"error\": ");
    cs_json_string(o, p->error);
    cs_outf(o, ",\n  \"findings\": [");
    j->nproc++;
    j->nfind = 0;
}

static void json_frame(cs_out *o, const cs_frame_info *f)
{
    if (f->python) {
        cs_outf(o, "{\"python\": true, \"file\": ");
        str_or_empty(o, f->file);
        cs_outf(o, ", \"line\": %u, \"function\": ", f->line);
        str_or_empty(o, f->function);
        cs_outf(o, "}");
        return;
    }
    cs_outf(o, "{\"python\": false, \"module\": ");
    str_or_empty(o, base_name(f->module));
    cs_outf(o, ", \"address\": \"0x%llx\", \"function\": ", (unsigned long long)f->address);
    str_or_empty(o, f->function);
    cs_outf(o, ", \"file\": ");
    str_or_empty(o, f->file);
    cs_outf(o, ", \"line\": %u, \"module_path\": ", f->line);
    str_or_empty(o, f->module);
    cs_outf(o, ", \"offset\": \"0x%llx\", \"build_id\": ", (unsigned long long)f->offset);
    str_or_empty(o, f->build_id);
    cs_outf(o, ", \"inlined\": %s}", f->inlined ? "true" : "false");
}

static void json_event(cs_out *o, const cs_proc_info *p, const cs_event *ev, const char *phrase,
                       const cs_stack_source *src)
{
    /* times relative to the process start read better than raw
     * CLOCK_MONOTONIC values */
    uint64_t t = ev->time_ns;
    if (p->start_mono_ns && t >= p->start_mono_ns)
        t -= p->start_mono_ns;
    cs_outf(o, "{\"event\": ");
    str_or_empty(o, cs_event_name(ev));
    cs_outf(o, ", \"phrase\": ");
    str_or_empty(o, phrase);
    cs_outf(o, ", \"thread\": %u, \"time_ns\": %llu, \"flags\": %u,", ev->thread,
            (unsigned long long)t, ev->flags);
    /* the word the reachability scan found, and what memory holds it */
    if ((ev->kind == CS_EV_REACHABLE || ev->kind == CS_EV_NP_REACHABLE) && ev->a) {
        cs_outf(o, " \"stored_at\": \"0x%llx\", \"memory\": ", (unsigned long long)ev->a);
        const char *name = cs_where_name(ev->aux);
        if (name)
            cs_outf(o, "\"%s\",", name);
        else
            cs_outf(o, "null,");
    }
    /* the event as recorded (tracefmt.h's cs_event), so that `capsan
     * report` can render a saved report (the pytest plugin's) with the
     * same words as a trace */
    cs_outf(o, " \"record\": {\"kind\": %u, \"aux\": %u, \"obj\": \"0x%llx\", \"a\": \"0x%llx\", "
            "\"b\": \"0x%llx\", \"c\": \"0x%llx\", \"extra\": %u},", ev->kind, ev->aux,
            (unsigned long long)ev->obj, (unsigned long long)ev->a, (unsigned long long)ev->b,
            (unsigned long long)ev->c, ev->extra);
    cs_outf(o, " \"stack\": [");
    cs_frame_info frames[JSON_MAX_FRAMES];
    int n = src ? cs_stack_frames(src, ev->stack, frames, JSON_MAX_FRAMES) : 0;
    for (int k = 0; k < n; k++) {
        if (k)
            cs_outf(o, ", ");
        json_frame(o, &frames[k]);
    }
    cs_outf(o, "]}");
}

void cs_json_finding(cs_json *j, const cs_proc_info *p, const cs_finding *f,
                     const cs_stack_source *src)
{
    cs_out *o = j->o;
    char msg[512];
    cs_outf(o, "%s\n   {\"kind\": ", j->nfind ? "," : "");
    str_or_empty(o, cs_kind_name(f->kind));
    cs_outf(o, ", \"severity\": \"%s\", \"message\": ",
            cs_finding_severity(f) == CS_SEV_WARNING ? "warning" : "error");
    cs_json_string(o, cs_finding_message(f, msg, sizeof msg));
    cs_outf(o, ", \"object\": {\"type\": ");
    str_or_empty(o, cs_finding_object_type(f));
    cs_outf(o, ", \"address\": \"0x%llx\"}, \"bytes\": %llu, \"detail\": %u, "
            "\"value\": \"0x%llx\",", (unsigned long long)f->obj, (unsigned long long)f->bytes,
            f->detail, (unsigned long long)f->value);
    /* a double delete names the finding that made its first release wrong */
    if (f->kind == CS_KIND_DLPACK_DOUBLE_DELETE && f->detail) {
        cs_outf(o, " \"cause\": ");
        str_or_empty(o, cs_kind_name((int)f->detail));
        cs_outf(o, ",");
    }
    cs_outf(o, " \"events\": [");

    int nev = f->nevents < CS_FINDING_MAX_EVENTS ? f->nevents : CS_FINDING_MAX_EVENTS;
    for (int i = 0; i < nev; i++) {
        cs_outf(o, "%s\n    ", i ? "," : "");
        json_event(o, p, &f->events[i], cs_event_phrase(f, i), src);
    }
    cs_outf(o, "]");
    /* LeakSanitizer's indirect leaks: kept alive only by this one */
    if (f->nindirect) {
        cs_outf(o, ", \"indirect_bytes\": %llu, \"indirect_objects\": %u, \"indirect\": [",
                (unsigned long long)f->indirect_bytes, f->nindirect);
        unsigned ni = f->nindirect < CS_FINDING_MAX_INDIRECT ? f->nindirect : CS_FINDING_MAX_INDIRECT;
        for (unsigned i = 0; i < ni; i++) {
            const cs_indirect *in = &f->indirect[i];
            cs_outf(o, "%s\n    {\"kind\": ", i ? "," : "");
            str_or_empty(o, cs_kind_name(in->kind));
            cs_outf(o, ", \"bytes\": %llu, \"object\": {\"type\": \"numpy data\", "
                    "\"address\": \"0x%llx\"}, \"events\": [",
                    (unsigned long long)in->bytes, (unsigned long long)in->obj);
            json_event(o, p, &in->alloc, "allocated at", src);
            cs_outf(o, "]}");
        }
        cs_outf(o, "]");
    }
    if (j->finding_extra)
        j->finding_extra(j->extra_ud, o);
    cs_outf(o, "}");
    j->nfind++;
}

void cs_json_process_end(cs_json *j, const cs_summary *s)
{
    cs_out *o = j->o;
    cs_outf(o, "%s],\n  \"summary\": {\"errors\": %u, \"warnings\": %u, \"leaked_bytes\": %llu, "
            "\"indirect_bytes\": %llu, \"events\": %llu, \"leak_objects\": %u, "
            "\"indirect_objects\": %u, \"suppressed\": %u, \"per_kind\": {",
            j->nfind ? "\n  " : "", s->errors, s->warnings,
            (unsigned long long)s->leaked_bytes, (unsigned long long)s->indirect_bytes,
            (unsigned long long)s->events, s->leak_objects, s->indirect_objects, s->suppressed);
    int first = 1;
    for (int k = 1; k < CS_KIND_COUNT; k++) {
        if (!s->per_kind[k])
            continue;
        cs_outf(o, "%s", first ? "" : ", ");
        str_or_empty(o, cs_kind_name(k));
        cs_outf(o, ": %u", s->per_kind[k]);
        first = 0;
    }
    cs_outf(o, "}}}");
}

void cs_json_end(cs_json *j)
{
    cs_outf(j->o, "%s]}\n", j->nproc ? "\n" : "");
}
