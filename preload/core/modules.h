/* The module map in the trace (CS_REC_MODULE): load bias, address range
 * and build id of every loaded object, so the report tool can symbolize
 * return addresses after the process is gone. */
#ifndef CAPSAN_MODULES_H
#define CAPSAN_MODULES_H

/* Write records for objects not yet in the current trace file. */
void cs_modules_note(void);
/* A record for every loaded object, remembering none: from a crash
 * handler (no lock of capsan's, no allocation). */
void cs_modules_note_all(void);

#endif
