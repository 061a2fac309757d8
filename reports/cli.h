/* Shared by the capsan CLI's commands (cli.c: run, main; report.c). */
#ifndef CAPSAN_CLI_H
#define CAPSAN_CLI_H

#include <stdio.h>

#define EXIT_USAGE 2

extern const char cs_usage_text[];

/* "capsan: <message>\n(capsan --help for usage)", then exit(EXIT_USAGE) */
void cs_usage_error(const char *fmt, ...) __attribute__((format(printf, 1, 2), noreturn));
/* --flag=value or --flag value; advances *i past a separate value */
char *cs_flag_value(int argc, char **argv, int *i, const char *flag);

int cs_cmd_report(int argc, char **argv);
int cs_cmd_symbolize(int argc, char **argv);
/* `capsan report --format text PATH`, written to out (capsan run prints a
 * killed child's report on stderr: the child could not). Returns 1 if the
 * trace was unreadable or damaged. */
int cs_report_text_one(const char *path, FILE *out);

#endif
