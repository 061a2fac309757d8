/* libunwind without the program's descriptors. When DWARF unwinding fails,
 * libunwind 1.6 walks the frame chain and checks each address by write()ing
 * a byte of it into a pipe of its own, kept in fixed descriptor numbers and
 * re-created with close() and pipe2() when a read fails. In a program that
 * closes its descriptors that pipe's numbers become the program's files
 * (libunwind then reads and writes them), and its pipe2() can take 0, 1
 * or 2. These hooks, patched into libunwind only, give it a pipe that is
 * no descriptor at all: the check is a process_vm_readv of the address.
 * (libunwind reads and writes that pipe with syscall(SYS_read/SYS_write),
 * so syscall() is hooked too, for those two only.) */
#ifndef CAPSAN_UNWFD_H
#define CAPSAN_UNWFD_H

#include "got.h"

extern const cs_hook cs_unwfd_hooks[];
extern const int cs_unwfd_nhooks;

#endif
