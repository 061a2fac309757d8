/* `capsan report` (report.c), which `capsan run` (cli.c) also calls. */
#ifndef CAPSAN_REPORT_H
#define CAPSAN_REPORT_H

#include <stdio.h>

int cs_cmd_report(int argc, char **argv);
/* `capsan report --format text PATH`, written to out (capsan run prints a
 * killed child's report on stderr: the child could not). Returns 1 if the
 * trace was unreadable or damaged. */
int cs_report_text_one(const char *path, FILE *out);

#endif
