/* SARIF 2.1.0 from the JSON report (see sarif.h). */
#include "sarif.h"

#include <limits.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "json.h"
#include "jsonparse.h"
#include "lifecycle.h"
#include "render.h"

#ifndef CAPSAN_VERSION
#define CAPSAN_VERSION "unknown"
#endif

#define SCHEMA_URI "https://docs.oasis-open.org/sarif/sarif/v2.1.0/errata01/os/schemas/sarif-schema-2.1.0.json"

static void file_write(void *ud, const char *s, size_t n)
{
    fwrite(s, 1, n, (FILE *)ud);
}

/* the first folder holding .git from the current directory up, with a
 * trailing slash, or "" */
static void find_root(char *root, size_t cap)
{
    char dir[PATH_MAX], probe[PATH_MAX + 8];
    root[0] = 0;
    if (!getcwd(dir, sizeof dir))
        return;
    for (;;) {
        snprintf(probe, sizeof probe, "%s/.git", strcmp(dir, "/") ? dir : "");
        if (access(probe, F_OK) == 0) {
            snprintf(root, cap, "%s/", strcmp(dir, "/") ? dir : "");
            return;
        }
        char *slash = strrchr(dir, '/');
        if (!slash || slash == dir)
            return;
        *slash = 0;
    }
}

/* A file URI's path part: RFC 3986 unreserved bytes and '/' as they are,
 * every other byte percent-encoded (a file name may hold any byte). */
static void uri_path(cs_out *o, const char *p)
{
    for (const unsigned char *s = (const unsigned char *)p; *s; s++) {
        if ((*s >= 'a' && *s <= 'z') || (*s >= 'A' && *s <= 'Z') || (*s >= '0' && *s <= '9') ||
            strchr("/-._~", *s))
            cs_outf(o, "%c", *s);
        else
            cs_outf(o, "%%%02X", *s);
    }
}

/* the uri of a Python file: relative to the root (uriBaseId %SRCROOT%)
 * when under it, else an absolute file URI */
static void artifact(cs_out *o, const char *file, const char *root)
{
    size_t rl = strlen(root);
    cs_outf(o, "{\"uri\": \"");
    if (rl && strncmp(file, root, rl) == 0) {
        uri_path(o, file + rl);
        cs_outf(o, "\", \"uriBaseId\": \"%%SRCROOT%%\"}");
    } else {
        cs_outf(o, "file://");
        uri_path(o, file[0] == '/' ? file : "/");
        if (file[0] != '/')
            uri_path(o, file);
        cs_outf(o, "\"}");
    }
}

/* the innermost Python frame of an event's stack with a real file (not
 * "<string>" or a frozen module's "<frozen ...>"), or NULL */
static const cs_jv *python_frame(const cs_jv *event)
{
    const cs_jv *st = cs_jv_get(event, "stack");
    if (!st || st->type != CS_JV_ARR)
        return NULL;
    for (size_t i = 0; i < st->n; i++) {
        const cs_jv *fr = &st->items[i];
        if (cs_jv_bool(fr, "python") && cs_jv_str(fr, "file")[0] &&
            cs_jv_str(fr, "file")[0] != '<' && cs_jv_uint(fr, "line", 0) > 0)
            return fr;
    }
    return NULL;
}

static void location(cs_out *o, const cs_jv *fr, const char *root, int id, const char *msg)
{
    cs_outf(o, "{");
    if (id >= 0)
        cs_outf(o, "\"id\": %d, ", id);
    cs_outf(o, "\"physicalLocation\": {\"artifactLocation\": ");
    artifact(o, cs_jv_str(fr, "file"), root);
    cs_outf(o, ", \"region\": {\"startLine\": %llu}}",
            (unsigned long long)cs_jv_uint(fr, "line", 1));
    const char *fn = cs_jv_str(fr, "function");
    if (fn[0]) {
        cs_outf(o, ", \"logicalLocations\": [{\"name\": ");
        cs_json_string(o, fn);
        cs_outf(o, ", \"kind\": \"%s\"}]", strcmp(fn, "<module>") ? "function" : "module");
    }
    if (msg) {
        cs_outf(o, ", \"message\": {\"text\": ");
        cs_json_string(o, msg);
        cs_outf(o, "}");
    }
    cs_outf(o, "}");
}

static const char *level_of(const char *severity)
{
    return strcmp(severity, "error") == 0     ? "error"
           : strcmp(severity, "warning") == 0 ? "warning"
                                              : "note";
}

static void result(cs_out *o, const cs_jv *f, const cs_jv *proc, const char *root, int *first)
{
    const char *kind = cs_jv_str(f, "kind");
    const cs_jv *evs = cs_jv_get(f, "events");
    size_t nev = evs && evs->type == CS_JV_ARR ? evs->n : 0;
    /* the latest event with a Python line is where the finding happened */
    const cs_jv *primary = NULL;
    for (size_t i = nev; i-- > 0 && !primary;)
        primary = python_frame(&evs->items[i]);
    cs_outf(o, "%s\n    {\"ruleId\": ", *first ? "" : ",");
    *first = 0;
    cs_json_string(o, kind);
    cs_outf(o, ", \"ruleIndex\": %d, \"level\": \"%s\", \"message\": {\"text\": ",
            cs_kind_from_name(kind) - 1, level_of(cs_jv_str(f, "severity")));
    cs_json_string(o, cs_jv_str(f, "message"));
    cs_outf(o, "}, \"locations\": [");
    if (primary)
        location(o, primary, root, -1, NULL);
    cs_outf(o, "], \"relatedLocations\": [");
    int id = 0;
    for (size_t i = 0; i < nev; i++) {
        const cs_jv *fr = python_frame(&evs->items[i]);
        if (!fr)
            continue;
        const char *phrase = cs_jv_str(&evs->items[i], "phrase");
        if (id)
            cs_outf(o, ", ");
        location(o, fr, root, id++, phrase[0] ? phrase : cs_jv_str(&evs->items[i], "event"));
    }
    cs_outf(o, "], \"properties\": {\"pid\": %llu, \"object\": ",
            (unsigned long long)cs_jv_uint(proc, "pid", 0));
    const cs_jv *obj = cs_jv_get(f, "object");
    cs_json_string(o, obj ? cs_jv_str(obj, "type") : "");
    cs_outf(o, ", \"bytes\": %llu}}", (unsigned long long)cs_jv_uint(f, "bytes", 0));
}

/* every kind, in kinds.inc's order, so a result's ruleIndex is its kind's
 * number less one */
static void rules(cs_out *o)
{
    for (int k = 1; k < CS_KIND_COUNT; k++) {
        const char *sev = cs_kind_severity(k) == CS_SEV_ERROR     ? "error"
                          : cs_kind_severity(k) == CS_SEV_WARNING ? "warning"
                                                                  : "note";
        cs_outf(o, "%s\n      {\"id\": ", k > 1 ? "," : "");
        cs_json_string(o, cs_kind_name(k));
        cs_outf(o, ", \"shortDescription\": {\"text\": ");
        cs_json_string(o, cs_kind_help(k));
        cs_outf(o, "}, \"help\": {\"text\": \"capsan's docs/findings.md, section %s\"}, "
                "\"defaultConfiguration\": {\"level\": \"%s\"}}",
                cs_kind_name(k), sev);
    }
}

int cs_sarif_write(FILE *out, const char *json, size_t len, char *err, size_t errlen)
{
    cs_jv *doc = cs_jv_parse(json, len, err, errlen);
    if (!doc)
        return -1;
    char root[PATH_MAX + 2];
    find_root(root, sizeof root);
    cs_out o = {.write = file_write, .ud = out};
    cs_outf(&o, "{\"$schema\": \"%s\", \"version\": \"2.1.0\", \"runs\": [{\n"
                "  \"tool\": {\"driver\": {\"name\": \"capsan\", \"version\": \"%s\", "
                "\"rules\": [",
            SCHEMA_URI, CAPSAN_VERSION);
    rules(&o);
    cs_outf(&o, "]}},\n");
    if (root[0]) {
        cs_outf(&o, "  \"originalUriBaseIds\": {\"%%SRCROOT%%\": {\"uri\": \"file://");
        uri_path(&o, root);
        cs_outf(&o, "\"}},\n");
    }
    cs_outf(&o, "  \"results\": [");
    int first = 1;
    const cs_jv *procs = cs_jv_get(doc, "processes");
    for (size_t p = 0; procs && procs->type == CS_JV_ARR && p < procs->n; p++) {
        const cs_jv *fs = cs_jv_get(&procs->items[p], "findings");
        for (size_t i = 0; fs && fs->type == CS_JV_ARR && i < fs->n; i++)
            result(&o, &fs->items[i], &procs->items[p], root, &first);
    }
    cs_outf(&o, "]\n}]}\n");
    cs_jv_free(doc);
    return 0;
}
