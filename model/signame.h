/* Signal names for reports: what glibc's sigabbrev_np() and sigdescr_np()
 * give, which only glibc 2.32 and later have (the wheel is for 2.28).
 * A table lookup, so the crash handler may call them. */
#ifndef CAPSAN_SIGNAME_H
#define CAPSAN_SIGNAME_H

/* "SEGV" for SIGSEGV; NULL for a signal with no name (real-time ones) */
const char *cs_sig_abbrev(int sig);
/* "Segmentation fault" for SIGSEGV; NULL likewise */
const char *cs_sig_descr(int sig);

#endif
