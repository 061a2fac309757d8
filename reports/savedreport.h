/* A saved report: the file `pytest --capsan --capsan-report=PATH` writes
 * (JSON: every traced test with the findings the runtime reported in it,
 * each as the runtime's JSON finding, event records included). Rebuilt
 * here into findings and a stack source, so that `capsan report` renders
 * it with the same code, words and symbolizer as a trace: the findings are
 * the runtime's own, and only the rendering happens again.
 *
 * Native frames are named anew with DWARF (file:line, inlined calls) when
 * the module's file is still there with the same build id; otherwise they
 * keep the names the runtime gave them. */
#ifndef CAPSAN_SAVEDREPORT_H
#define CAPSAN_SAVEDREPORT_H

#include <stddef.h>
#include <stdint.h>
#include "lifecycle.h"
#include "render.h"

typedef struct cs_saved_test {
    const char *nodeid;       /* NULL: the findings outside every test */
    size_t first, n;          /* its findings: findings[first, first + n) */
} cs_saved_test;

typedef struct cs_saved {
    uint64_t pid, ppid;
    const char **argv;        /* argc strings (pytest's command line), or none */
    unsigned argc;
    const char *exe;          /* or "" */
    int status;               /* pytest's exit status; -1 if not saved */
    size_t ntraced;           /* traced tests, with findings or not */
    cs_saved_test *tests;     /* those with findings, in run order, then the outside ones */
    size_t ntests;
    cs_finding *findings;
    unsigned char *allowed;   /* per finding: a kind the test allowed */
    size_t nfindings;
    unsigned skipped;         /* findings of kinds this capsan does not know */
    struct cs_saved_priv *priv;
} cs_saved;

/* 1 when the file's first byte that is not blank is '{' (a JSON text) */
int cs_saved_sniff(const char *path);

/* Reads and rebuilds the report; NULL with a message in err when the file
 * cannot be read, is not JSON, or is not a pytest report of capsan's. */
cs_saved *cs_saved_open(const char *path, char *err, size_t errlen);
void cs_saved_close(cs_saved *s);

/* The stack source of its findings (valid until cs_saved_close). */
cs_stack_source cs_saved_source(cs_saved *s);

#endif
