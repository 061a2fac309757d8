/* `capsan run` saw its child die by a signal that no handler sees
 * (SIGKILL: the OOM killer, a supervisor, a timeout). The child's trace
 * then has no END record, and its report could only say "killed, or still
 * running". The parent knows which: it appends the END record, how =
 * CS_END_SIGNAL with the signal number, so the report says "signal" and
 * the killed verdict (live objects as warnings) applies as before. */
#ifndef CAPSAN_SEAL_H
#define CAPSAN_SEAL_H

#include <stddef.h>

/* Appends END to the trace of `pid` at `path`, after its last record.
 * 1: written; 0: it already had one; -1: left alone, why says why (not a
 * trace of that pid, a damaged end, no write access). */
int cs_trace_seal(const char *path, long pid, int sig, char *why, size_t whylen);

#endif
