/* `capsan symbolize` (symcmd.c): module + offset lines in, frames out, for
 * the Python package's live reports. */
#ifndef CAPSAN_SYMCMD_H
#define CAPSAN_SYMCMD_H

int cs_cmd_symbolize(int argc, char **argv);

#endif
