/* Reads of memory that may be unmapped, for the _exit scan's judgements
 * of dead objects (pypools.c, ftdead.c): through the kernel, so a word
 * that is not an address faults nothing. */
#ifndef CAPSAN_PEEK_H
#define CAPSAN_PEEK_H

#include <stddef.h>
#include <stdint.h>
#include <sys/uio.h>
#include <unistd.h>

static inline int cs_peek_word(uintptr_t a, uint64_t *v)
{
    struct iovec local = {v, sizeof *v}, remote = {(void *)a, sizeof *v};
    return a && !(a & 7) && process_vm_readv(getpid(), &local, 1, &remote, 1, 0) == sizeof *v;
}

/* t is a type object: its type (at ob_type_off) is `type`, or a metaclass
 * whose type is */
static inline int cs_peek_is_type(uint64_t t, uintptr_t type_type, size_t ob_type_off)
{
    uint64_t mt, mmt;
    if (!cs_peek_word(t + ob_type_off, &mt))
        return 0;
    return mt == type_type || (cs_peek_word(mt + ob_type_off, &mmt) && mmt == type_type);
}

#endif
