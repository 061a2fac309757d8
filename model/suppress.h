/* Suppressions for `capsan report --suppressions FILE`, LeakSanitizer
 * syntax: one `KIND:pattern` per line, `#` starts a comment. KIND is a
 * finding kind name, `leak` (every *-leak kind) or `*` (every kind). The
 * pattern is matched against the function, source file and module of every
 * frame of every event stack of a finding: `*` matches any run of
 * characters, `^` / `$` anchor at the start / end, and without anchors the
 * pattern may match anywhere in the name. */
#ifndef CAPSAN_SUPPRESS_H
#define CAPSAN_SUPPRESS_H

#include <stddef.h>
#include "render.h"

typedef struct cs_suppressions cs_suppressions;

/* NULL with a message naming the file and line on error. */
cs_suppressions *cs_supp_load(const char *path, char *err, size_t errlen);
void cs_supp_free(cs_suppressions *s);

/* 1 when a rule suppresses f (and counts the hit), else 0. */
int cs_supp_match(cs_suppressions *s, const cs_finding *f, const cs_stack_source *src);

/* LeakSanitizer's "Suppressions used:" block; nothing when none matched. */
void cs_supp_render_used(const cs_suppressions *s, cs_out *o);

/* A suppression line for f, ready to paste (--gen-suppressions):
 * KIND:pattern naming one frame of the event that matters (a leak's
 * first event, the last event of any other finding): the innermost frame
 * of the program's own (not an installed library's), else the innermost
 * that is not the interpreter's, the standard library's or capsan's. A
 * function is written whole and anchored (^name$), a file or module by
 * its last component (/name$). Writes nothing and returns 0 when the
 * finding has no stack to name; else returns the length written (cut to
 * n - 1). Does not allocate: the runtime may use it too. */
size_t cs_supp_generate(const cs_finding *f, const cs_stack_source *src, char *buf, size_t n);

/* pattern match as described above, exposed for tests */
int cs_supp_pattern_match(const char *pattern, const char *name);

#endif
