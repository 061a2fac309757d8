/* CAPSAN_OPTIONS: one table (options.inc), parsed once at start-up. */
#ifndef CAPSAN_OPTIONS_H
#define CAPSAN_OPTIONS_H

typedef struct cs_options {
#define OPT_INT(n) long n;
#define OPT_BOOL(n) int n;
#define OPT_STR(n) char n[512];
#define OPT(t, n, d, h) OPT_##t(n)
#include "options.inc"
#undef OPT
#undef OPT_INT
#undef OPT_BOOL
#undef OPT_STR
} cs_options;

extern cs_options cs_opt;

/* Parse s ("k=v:k=v", also ',' separated) over the defaults. On an unknown
 * key or a bad value, writes a message to err and returns -1; the options
 * parsed so far stay in force. */
int cs_options_parse(const char *s, char *err, unsigned errlen);
void cs_options_defaults(void);
/* The options table with defaults and help, one per line. */
void cs_options_help(int fd);
/* "k=v:k=v" of every option, for the trace. */
void cs_options_format(char *buf, unsigned len);

#endif
