/* The command line's words, which every command of the CLI uses: its usage
 * text, a usage error, a flag's value. */
#include "usage.h"

#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

void cs_usage_error(const char *fmt, ...)
{
    va_list ap;
    fputs("capsan: ", stderr);
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputs("\n(capsan --help for usage)\n", stderr);
    exit(EXIT_USAGE);
}

const char cs_usage_text[] =
    "usage: capsan run [--log-path P] [--exitcode N] [--protect] [--halt-on-error]\n"
    "                  [--keep-trace] [--options K=V:K=V...] [--] CMD ARGS...\n"
    "         run CMD with the capsan runtime preloaded (its forks and exec'ed children\n"
    "         too, each writing its own trace); its report is printed at exit\n"
    "       capsan report [--format text|json|html|sarif] [-o OUT] [--suppressions FILE]\n"
    "                     [--max-findings N] [--gen-suppressions] [--strip-path-prefix P]\n"
    "                     [TRACE...]\n"
    "         replay trace files (also truncated ones) and render their findings, one\n"
    "         section per process, children after their parents; also the file of\n"
    "         pytest --capsan --capsan-report=PATH, each finding under its test; with\n"
    "         no TRACE, the capsan.trace.PID files in the current directory\n"
    "       capsan symbolize [--tsv]\n"
    "         read MODULE<TAB>OFFSET[<TAB>BUILD_ID] lines (OFFSET in hex) on standard\n"
    "         input; write for each a JSON array of the frames there, inlined calls first\n"
    "         (--tsv: FUNCTION<TAB>FILE<TAB>LINE<TAB>INLINED lines, an empty line after each)\n"
    "       capsan help-options\n"
    "         list every CAPSAN_OPTIONS key with its default\n"
    "       capsan --help, capsan --version\n";


char *cs_flag_value(int argc, char **argv, int *i, const char *flag)
{
    size_t fl = strlen(flag);
    if (strncmp(argv[*i], flag, fl) == 0 && argv[*i][fl] == '=')
        return argv[*i] + fl + 1;
    /* "--" ends the flags: it is never a flag's value */
    if (*i + 1 >= argc || strcmp(argv[*i + 1], "--") == 0)
        cs_usage_error("%s needs a value", flag);
    return argv[++*i];
}
