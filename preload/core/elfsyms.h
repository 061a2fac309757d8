/* Function names for the live report's native frames, from each module's
 * ELF file on disk: its .symtab holds the static functions that dladdr
 * (which reads only .dynsym, the exported ones) cannot name.
 *
 * Only the report path calls this (a finding printed or handed to Python),
 * never an event: a module's file is read once, at its first finding, and
 * its function symbols kept (sorted, in anonymous memory: no malloc, which
 * capsan hooks) for the process's life. A file whose build id differs from
 * the loaded object's (rebuilt since it was loaded) is not used. */
#ifndef CAPSAN_ELFSYMS_H
#define CAPSAN_ELFSYMS_H

#include <stdint.h>

/* The function symbol of the object loaded at bias `bias` from `path`
 * ("" for the main program) that holds the address bias + off; NULL if
 * the file has no .symtab or no sized function symbol holds it. *build_id
 * is the loaded object's GNU build id in hex, or NULL. Both stay valid for
 * the process's life. Thread-safe. */
const char *cs_elfsyms_name(const char *path, uintptr_t bias, uint64_t off, const char **build_id);

/* A forked child: the lock may have been held by another thread. */
void cs_elfsyms_fork_child(void);

#endif
