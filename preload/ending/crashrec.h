/* The crash in the trace: the crashing thread's native and Python stacks
 * (a CRASH record after END) and a last COUNTS point, so that `capsan
 * report` shows the backtrace the live crash report printed and the
 * memory plot reaches the crash. From the signal handler: nothing
 * allocated, no lock. */
#ifndef CAPSAN_CRASHREC_H
#define CAPSAN_CRASHREC_H

#include <stdint.h>

#include "stack.h"

/* w->ip[first..] are the crashing context's frames (w NULL: only pc) */
void cs_crashrec_write(const cs_crash_walk *w, int first, uint64_t pc, int tid);

#endif
