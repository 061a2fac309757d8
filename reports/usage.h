/* The command line's words (usage.c), below every command (cli.c's run and
 * main, report.c's report). */
#ifndef CAPSAN_USAGE_H
#define CAPSAN_USAGE_H

#include <stdio.h>

#define EXIT_USAGE 2

extern const char cs_usage_text[];

/* "capsan: <message>\n(capsan --help for usage)", then exit(EXIT_USAGE) */
void cs_usage_error(const char *fmt, ...) __attribute__((format(printf, 1, 2), noreturn));
/* --flag=value or --flag value; advances *i past a separate value */
char *cs_flag_value(int argc, char **argv, int *i, const char *flag);

#endif
