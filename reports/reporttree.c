/* `capsan report`: the traces named as a process tree. Each file's
 * header (or its kind: a report=json file, a pytest report), the
 * depth-first order (children after their parents, by start time), and
 * the tree printed at the end of the text report. */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "report_int.h"
#include "util.h"
#include "savedreport.h"

/* ---- the process tree ----------------------------------------------------------- */

void report_read_header(entry *e)
{
    int fd = open(e->path, O_RDONLY | O_CLOEXEC | O_NONBLOCK); /* never wait on a FIFO */
    cs_file_header h;
    if (fd < 0)
        return;
    ssize_t got = pread(fd, &h, sizeof h, 0);
    if (got == (ssize_t)sizeof h && memcmp(h.magic, CS_TRACE_MAGIC, 8) == 0) {
        e->has_hdr = 1;
        e->pid = h.pid;
        e->ppid = h.ppid;
        e->start = h.start_realtime_ns;
    }
    /* `capsan report capsan.trace.*` also matches report=json's
     * capsan.trace.PID.json files (json.c's first bytes; the pytest
     * plugin's report is JSON too, but another document) */
    static const char json_start[] = "{\"tool\": \"capsan\", \"format\": 1, \"processes\": [";
    _Static_assert(sizeof json_start - 1 <= sizeof h, "the header read holds the prefix");
    if (got >= (ssize_t)sizeof json_start - 1 && memcmp(&h, json_start, sizeof json_start - 1) == 0)
        e->json_report = 1;
    close(fd);
    /* any other JSON text: the pytest plugin's report, or not capsan's */
    if (!e->has_hdr && !e->json_report)
        e->saved = cs_saved_sniff(e->path);
}

/* (start, position) orders processes */
static int before(const entry *a, const entry *b)
{
    return a->start < b->start || (a->start == b->start && a->argi < b->argi);
}

/* j may be i's parent: it has i's ppid and did not start after it (a tie,
 * as in synthetic traces, counts unless the two name each other) */
static int may_parent(const entry *j, const entry *i)
{
    if (j == i || !j->has_hdr || !i->has_hdr || j->pid != i->ppid || j->start > i->start)
        return 0;
    return j->start < i->start || j->ppid != i->pid || j->argi < i->argi;
}

static entry **g_sort_entries;
static int child_cmp(const void *x, const void *y)
{
    const entry *a = g_sort_entries[*(const size_t *)x], *b = g_sort_entries[*(const size_t *)y];
    return before(a, b) ? -1 : before(b, a) ? 1 : 0;
}

/* Depth-first order: roots by start time, each followed by its children.
 * Damaged input may link processes in a cycle: its first member then
 * becomes a root, so every entry appears exactly once. */
size_t *report_tree_order(entry *e, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        e[i].parent = -1;
        for (size_t j = 0; j < n; j++)
            /* pid reuse: the latest candidate that started before */
            if (may_parent(&e[j], &e[i]) && (e[i].parent < 0 || before(&e[e[i].parent], &e[j])))
                e[i].parent = (long)j;
    }
    entry **ptrs = cs_xcalloc(n, sizeof *ptrs);
    for (size_t i = 0; i < n; i++)
        ptrs[i] = &e[i];
    g_sort_entries = ptrs;
    size_t *order = cs_xcalloc(n, sizeof *order), *idx = cs_xcalloc(n, sizeof *idx);
    for (size_t i = 0; i < n; i++)
        idx[i] = i;
    qsort(idx, n, sizeof *idx, child_cmp);
    char *seen = cs_xcalloc(n, 1);
    size_t *stack = cs_xcalloc(n, sizeof *stack), sp = 0, k = 0;
    for (int pass = 0; pass < 2; pass++) {
        for (size_t r = 0; r < n; r++) {
            size_t root = idx[r];
            if (seen[root] || (pass == 0 && e[root].parent >= 0))
                continue;
            e[root].parent = -1;    /* pass 1: a cycle's first member */
            seen[root] = 1;
            stack[sp++] = root;
            while (sp) {
                size_t i = stack[--sp];
                order[k++] = i;
                e[i].depth = e[i].parent >= 0 ? e[e[i].parent].depth + 1 : 0;
                for (size_t q = n; q-- > 0;)
                    if (e[idx[q]].parent == (long)i && !seen[idx[q]]) {
                        seen[idx[q]] = 1;
                        stack[sp++] = idx[q];
                    }
            }
        }
    }
    free(seen);
    free(stack);
    free(idx);
    free(ptrs);
    g_sort_entries = NULL;
    return order;
}

void report_text_tree(cs_out *o, entry *e, const size_t *order, size_t n)
{
    size_t shown = 0;
    for (size_t k = 0; k < n; k++)
        shown += e[order[k]].done && e[order[k]].line;
    if (shown < 2)
        return;
    cs_outf(o, "== process tree (%zu processes) ==\n", shown);
    for (size_t k = 0; k < n; k++) {
        const entry *x = &e[order[k]];
        if (!x->line)
            continue;
        /* one guide per ancestor level: "|   " while that level has more
         * children below, then "|-- " or "`-- " for this one */
        for (int d = 1; d <= x->depth; d++) {
            int more = 0;
            for (size_t j = k + 1; j < n; j++) {
                int dj = e[order[j]].depth;
                if (dj < d)
                    break;
                if (dj == d) {
                    more = 1;
                    break;
                }
            }
            if (d < x->depth)
                cs_outf(o, "%s", more ? "|   " : "    ");
            else
                cs_outf(o, "%s", more ? "|-- " : "`-- ");
        }
        cs_outf(o, "%s\n", x->line);
    }
    cs_outf(o, "\n");
}
