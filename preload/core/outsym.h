/* Native frames named as `capsan report` names them (DWARF: inlined calls,
 * source files), asked of `capsan symbolize` in a child process, as the
 * sanitizers ask an external symbolizer. The runtime's own names come
 * from the symbol tables only (elfsyms.h); a suppression that names a
 * source file or an inlined function needs these to match live exactly
 * as it matches in the report. Findings only: one child per call. */
#ifndef CAPSAN_OUTSYM_H
#define CAPSAN_OUTSYM_H

#include <stdint.h>

#include "render.h"

typedef struct cs_outsym cs_outsym;

cs_outsym *cs_outsym_new(void);
/* ask for the return address ip of module (path) at offset (ip - bias) */
void cs_outsym_want(cs_outsym *s, uint64_t ip, const char *module, uint64_t offset);
/* run the symbolizer for every address asked; 0, or -1 (then nothing is
 * known, and the caller keeps its own names) */
int cs_outsym_run(cs_outsym *s);
/* the frames at ip (inlined calls first), module and offset as asked;
 * 0 when unknown */
int cs_outsym_frames(const cs_outsym *s, uint64_t ip, cs_frame_info *out, int max);
void cs_outsym_free(cs_outsym *s);

#endif
