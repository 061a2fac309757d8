/* SARIF 2.1.0 (capsan report --format sarif), for code scanning in CI.
 *
 * Written from the JSON report (the contract), read back with jsonparse:
 * one run whose results are every process's findings. A result's rule is
 * its kind; its location is the Python file:line of its latest event (a
 * leak's consume, a double delete's second delete), relative to the
 * repository root when the file lies under one; the other events (export,
 * consume, release...) are related locations. */
#ifndef CAPSAN_SARIF_H
#define CAPSAN_SARIF_H

#include <stddef.h>
#include <stdio.h>

/* Writes json[0, len) as SARIF to out. The repository root is the first
 * folder holding .git from the current directory up. 0, or -1 with a
 * message in err. */
int cs_sarif_write(FILE *out, const char *json, size_t len, char *err, size_t errlen);

#endif
