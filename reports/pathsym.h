/* Symbolizing addresses known only as module file + offset (a saved
 * report's frames, `capsan symbolize`'s input) with the trace symbolizer
 * (symbolize.h), which checks the build id when one is given. */
#ifndef CAPSAN_PATHSYM_H
#define CAPSAN_PATHSYM_H

#include <stddef.h>
#include <stdint.h>
#include "render.h"

typedef struct cs_pathsym cs_pathsym;

cs_pathsym *cs_pathsym_create(void);
void cs_pathsym_destroy(cs_pathsym *ps);

/* The module's number (1-based) for an absolute path and its build id in
 * hex (NULL or "": not checked); 0 for a path no symbolizer could open. */
size_t cs_pathsym_module(cs_pathsym *ps, const char *path, const char *build_id);

/* Describes module + offset (a return address: the call before it is
 * looked up) as cs_sym_native does, inlined calls first; 0 when DWARF and
 * the symbol table named nothing there (the file is gone, replaced, or
 * has neither). address and offset are left for the caller to set; the
 * strings stay valid until cs_pathsym_destroy. */
int cs_pathsym_native(cs_pathsym *ps, size_t module, uint64_t offset, cs_frame_info *out, int max);

#endif
