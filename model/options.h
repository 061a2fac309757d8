/* CAPSAN_OPTIONS: one table (options.inc), parsed once at start-up. The
 * command line tool links the same parser to check `capsan run` flags. */
#ifndef CAPSAN_OPTIONS_H
#define CAPSAN_OPTIONS_H

typedef struct cs_options {
#define OPT_INT(n) long n;
#define OPT_BOOL(n) int n;
#define OPT_STR(n) char n[512];
#define OPT(t, n, d, v, h) OPT_##t(n)
#include "options.inc"
#undef OPT
#undef OPT_INT
#undef OPT_BOOL
#undef OPT_STR
} cs_options;

extern cs_options cs_opt;

/* Parse s ("k=v:k=v", also ',' separated, as the sanitizers do) over the
 * current values. source names where s came from in messages
 * ("CAPSAN_OPTIONS"). Every unknown key and bad value is described in err,
 * one line each, and leaves that option as it was; returns -1 if there
 * was any, else 0. */
int cs_options_parse(const char *s, const char *source, char *err, unsigned errlen);
void cs_options_defaults(void);
/* The options table, one line per option: name, type, default, valid
 * values, help. */
void cs_options_help(int fd);
/* The default of an option as written in options.inc, or NULL. */
const char *cs_option_default(const char *name);
/* "k=v:k=v" of every option, for the trace. */
void cs_options_format(char *buf, unsigned len);

#endif
