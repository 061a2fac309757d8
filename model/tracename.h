/* Where a process's trace goes: the log_path option's contract, shared by
 * the runtime (which writes the file) and `capsan run` (which finds it).
 *
 * log_path is a prefix, the file LOG_PATH.PID; a %p in it is replaced by
 * the pid instead (and %% by %), as the sanitizers' log_path does.
 * "/dev/null" and "stderr" mean no trace file at all: the findings are
 * printed on stderr at exit, as always. */
#ifndef CAPSAN_TRACENAME_H
#define CAPSAN_TRACENAME_H

#include <stddef.h>

/* log_path writes no file */
int cs_log_path_none(const char *log_path);
/* The trace file of process pid in out; -1 when log_path writes no file
 * or the name does not fit. Async-signal-safe (a crash handler opens the
 * trace). */
int cs_trace_name(char *out, size_t cap, const char *log_path, long pid);
/* The pid when file name `name` (no directory) is a trace of log_path's
 * last component `base`, else -1. */
long cs_trace_name_pid(const char *name, const char *base);

#endif
