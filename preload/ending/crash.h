/* Crash signals (crash.c): SIGSEGV, SIGBUS, SIGILL, SIGFPE and SIGABRT get
 * capsan's handler. It finishes the trace (its END record; the trace is
 * opened then if no record had opened it) and writes the crash report
 * (the signal, the fault address, the crashing thread's native and Python
 * stacks, the findings so far, the `capsan report` command) to the stderr
 * the process had when capsan started, and to the current fd 2 when that
 * is another file now. start.c starts it; nothing else calls it. */
#ifndef CAPSAN_CRASH_H
#define CAPSAN_CRASH_H

/* Keep the stderr of this moment and install the handlers where the
 * program has none of its own (faulthandler's excepted: capsan's goes on
 * top of it and hands the signal on to it). */
void cs_crash_init(void);

#endif
