/* Quarantine of released DLPack managed structs (AddressSanitizer's idea).
 *
 * A deleter normally frees its struct. If a buggy program releases the
 * same struct again later, the deleter field it jumps through lies in
 * freed memory that malloc may have handed to someone else: a jump into
 * garbage, and a later struct at the same address would be taken for the
 * one released. While a deleter runs through capsan's trampoline, the
 * free() or PyMem_Free() of the block that holds its struct is deferred
 * instead: the block waits in a FIFO bounded by count and bytes
 * (quarantine_count, quarantine_bytes), with capsan's trampoline written
 * back into its deleter field, so a second release reaches the trampoline
 * and is judged (dlpack-double-delete; protect=1 skips it). */
#ifndef CAPSAN_QUARANTINE_H
#define CAPSAN_QUARANTINE_H

#include <stddef.h>
#include <stdint.h>

/* the struct whose deleter runs on this thread through the trampoline
 * (NULL: none) */
extern __thread void *cs_qr_mt __attribute__((tls_model("initial-exec")));

/* how far into its block a struct may lie */
#define CS_QR_REACH 4096

int cs_qr_take_slow(void *p, unsigned how);
/* The program frees p by `how` (CS_FREED_LIBC or CS_FREED_PYMEM): 1 if
 * the block was quarantined (the caller must not free it), 0 to free it
 * now. One TLS load outside deleters; inside one, a block that starts
 * above the struct or more than CS_QR_REACH below it (most of what a
 * deleter frees) costs a compare more, and no call. */
static inline int cs_qr_take(void *p, unsigned how)
{
    uintptr_t m = (uintptr_t)cs_qr_mt;
    if (__builtin_expect(m != 0, 0) && m - (uintptr_t)p <= CS_QR_REACH)
        return cs_qr_take_slow(p, how);
    return 0;
}

/* Run the deleter fn on mt with its struct's free quarantined: versioned
 * is its layout (1 versioned, 0 not), or -1 for a struct released
 * already, whose free is then not done at all. A quarantined struct gets
 * `rearm` (the deleter trampoline) back in its deleter field. */
void cs_qr_call(void (*fn)(void *), void *mt, int versioned, void *rearm);

/* Free every quarantined malloc block: the very end of the process. The
 * PyMem blocks stay (the interpreter is gone). */
void cs_qr_flush(void);
/* fork(): hold the FIFO's lock across it (1 before, 0 after). */
void cs_qr_fork_lock(int lock);
/* Tell fn each quarantined block (reach.c leaves them out: freed memory). */
void cs_qr_own_memory(void (*fn)(void *ud, const void *p, size_t n), void *ud);

#endif
