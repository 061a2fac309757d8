/* Offline symbolizer for native return addresses recorded in a trace.
 *
 * Uses the MODULE records (load bias, address range, build id, path) and
 * libdw to name each address: function (demangled), source file:line and
 * the chain of inlined calls. It never fails: an address it cannot name
 * comes back as module+offset (with the build id), or as a bare address
 * outside every module. Results are cached per address; the strings they
 * point to live until cs_sym_destroy(). */
#ifndef CAPSAN_SYMBOLIZE_H
#define CAPSAN_SYMBOLIZE_H

#include <stddef.h>
#include <stdint.h>
#include "reader.h"
#include "render.h"

typedef struct cs_symbolizer cs_symbolizer;

/* exe names the main program, used for a module recorded with an empty
 * path (dl_iterate_phdr's name for the executable). The module array is
 * copied by reference: it must outlive the symbolizer. */
cs_symbolizer *cs_sym_create(const cs_module_rec *modules, size_t nmodules,
                             const char *exe);
void cs_sym_destroy(cs_symbolizer *s);
/* Closes the ELF files every symbolizer shared (at the end of a report). */
void cs_sym_cleanup(void);

/* Describes ip: up to max frames, innermost inlined call first, the
 * function that really holds the address last. Returns at least 1 when
 * max >= 1. Fits cs_stack_source.native. */
int cs_sym_native(cs_symbolizer *s, uint64_t ip, cs_frame_info *out, int max);

#endif
