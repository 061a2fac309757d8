/* What a clean `capsan run` watched. The sanitizers are silent on a clean
 * run; capsan run says one line instead, so that a run that watched
 * 10,000 exchanges is not mistaken for one that saw none. */
#ifndef CAPSAN_RUNSUMMARY_H
#define CAPSAN_RUNSUMMARY_H

#include <stdint.h>
#include <stdio.h>

/* The traces of log_path (tracename.h) begun at or after since_realtime_ns (this run's
 * processes). Those without an END record (a process killed by a signal
 * capsan does not catch, such as SIGTERM or SIGKILL, or one still running)
 * go to `unended`, in pid order, which reports them: nobody else will.
 * Then, when every other one ended with no finding, "capsan: no findings:
 * ..." with the processes, tensors, NumPy blocks and events they watched
 * goes to out. With remove_clean, the traces of processes that ended
 * with no finding are removed after (keep_trace=findings: a sanitizer
 * leaves a log only when it has something to say). Returns 1 if it
 * printed that line. */
int cs_run_summary(const char *log_path, uint64_t since_realtime_ns, FILE *out,
                   void (*unended)(const char *path, long pid, void *ud), void *ud,
                   int remove_clean);

#endif
