/* `capsan symbolize`: module file + offset lines on standard input, the
 * frames DWARF and the symbol tables name there on standard output, one
 * JSON array per line. The Python package asks it for the file:line of
 * the native frames in the text it renders (the runtime names functions
 * only: it links no DWARF reader). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "symcmd.h"
#include "usage.h"
#include "json.h"
#include "pathsym.h"
#include "symbolize.h"
#include "util.h"

#define MAX_INLINE 16

typedef struct query {
    size_t module;
    uint64_t offset;
} query;

static void file_write(void *ud, const char *s, size_t n)
{
    fwrite(s, 1, n, (FILE *)ud);
}

/* "PATH\tOFFSET[\tBUILD_ID]": OFFSET in hex, with or without 0x */
static query parse(cs_pathsym *ps, char *line)
{
    query q = {0};
    char *tab = strchr(line, '\t');
    if (!tab)
        return q;
    *tab = 0;
    char *off = tab + 1, *bid = strchr(off, '\t'), *end;
    if (bid)
        *bid++ = 0;
    q.offset = strtoull(off, &end, 16);
    if (end == off || *end)
        return q;
    q.module = cs_pathsym_module(ps, line, bid);
    return q;
}

/* one field of a --tsv line: tabs and line breaks would split it */
static void tsv_field(const char *s)
{
    for (; s && *s; s++)
        fputc(*s == '\t' || *s == '\n' || *s == '\r' ? ' ' : *s, stdout);
}

int cs_cmd_symbolize(int argc, char **argv)
{
    int tsv = 0;
    for (int i = 0; i < argc; i++) {
        if (strcmp(argv[i], "-h") == 0 || strcmp(argv[i], "--help") == 0) {
            fputs(cs_usage_text, stdout);
            return 0;
        }
        if (strcmp(argv[i], "--tsv") == 0) {
            tsv = 1;
            continue;
        }
        cs_usage_error("symbolize: unknown argument '%s' (it reads standard input)", argv[i]);
    }
    cs_pathsym *ps = cs_pathsym_create();
    /* every line first: the symbolizer is made once, for all the modules */
    query *qs = NULL;
    size_t n = 0, cap = 0, lcap = 0;
    char *line = NULL;
    ssize_t len;
    while ((len = getline(&line, &lcap, stdin)) >= 0) {
        while (len > 0 && (line[len - 1] == '\n' || line[len - 1] == '\r'))
            line[--len] = 0;
        if (n == cap) {
            cap = cap ? cap * 2 : 64;
            qs = cs_xrealloc(qs, cap * sizeof *qs);
        }
        qs[n++] = parse(ps, line);
    }
    free(line);
    cs_out o = {.write = file_write, .ud = stdout};
    for (size_t i = 0; i < n; i++) {
        cs_frame_info fr[MAX_INLINE];
        int k = cs_pathsym_native(ps, qs[i].module, qs[i].offset, fr, MAX_INLINE);
        if (tsv) { /* the runtime's form (no JSON reader there): a line a frame, then "" */
            for (int j = 0; j < k; j++) {
                tsv_field(fr[j].function);
                fputc('\t', stdout);
                tsv_field(fr[j].file);
                printf("\t%u\t%d\n", fr[j].line, fr[j].inlined);
            }
            fputc('\n', stdout);
            continue;
        }
        fputc('[', stdout);
        for (int j = 0; j < k; j++) {
            cs_outf(&o, "%s{\"function\": ", j ? ", " : "");
            cs_json_string(&o, fr[j].function ? fr[j].function : "");
            cs_outf(&o, ", \"file\": ");
            cs_json_string(&o, fr[j].file ? fr[j].file : "");
            cs_outf(&o, ", \"line\": %u, \"inlined\": %s}", fr[j].line,
                    fr[j].inlined ? "true" : "false");
        }
        fputs("]\n", stdout);
    }
    free(qs);
    cs_pathsym_destroy(ps);
    cs_sym_cleanup();
    if (fflush(stdout) != 0 || ferror(stdout))
        return 1;
    return 0;
}
