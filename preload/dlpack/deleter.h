/* A tensor on loan: a DLManagedTensor(Versioned) whose deleter capsan's
 * trampoline stands in for, and its birth event. One machine for both
 * ways a tensor crosses: a capsule (capsule.c) and DLPack 1.3's exchange
 * table (xapi.c). The original deleter is kept in the birth event. */
#ifndef CAPSAN_DELETER_H
#define CAPSAN_DELETER_H

#include <stdatomic.h>
#include <stdint.h>

#include "dltensor.h"
#include "tracefmt.h"

/* Every wrapped deleter slot holds this. */
void cs_dl_deleter_tramp(void *mt);

/* A struct checked and, when it can be followed, wrapped. */
typedef struct cs_loan {
    void *mt;
    int versioned;
    int followed;     /* the trampoline is in its slot (a read-only or
                       * unreadable struct cannot be followed) */
    void *deleter;    /* the owner's deleter (NULL is legal) */
    uint64_t nbytes, data;
    uint32_t fp;      /* the metadata's fingerprint (R20) */
    int np;
    cs_dl_problem probs[8];
} cs_loan;

/* Check mt (R13-R21) and put the trampoline in its deleter slot. A struct
 * wrapped already keeps the original its birth event names. Returns
 * l->followed. */
int cs_dl_wrap(cs_loan *l, void *mt, int versioned);
/* Its birth: an EXPORT event (a = the capsule; with a CS_DLV_X aux the
 * data), then its problems with that stack. A struct that cannot be
 * followed gets its problems only, and 0 is returned. */
int cs_dl_lent(cs_loan *l, uint64_t a, uint16_t aux, uint8_t flags);
/* Both (aux's CS_DLV_VERSIONED says the layout). */
int cs_dl_lend(void *mt, uint64_t a, uint16_t aux, uint8_t flags);

/* R20: fp, the metadata's fingerprint now, is not the one its export took
 * (export: its birth event); reported with ev's stack. */
void cs_dl_check_loan(const cs_event *ev, const cs_event *export, uint32_t fp);

/* R5, around a capsule destructor or a deleter run with the GIL (gil:
 * the caller knows it is held): the error indicator before
 * (cs_dl_err_before, NULL without the GIL or with none set), then the
 * check after the call, which reports a cleared,
 * replaced or newly left exception (cap: the capsule, NULL for a deleter). */
typedef struct _object PyObject_;
PyObject_ *cs_dl_err_before(int gil);
void cs_dl_err_after(int gil, PyObject_ *before, void *mt, PyObject_ *cap);

/* The last tensor with a NULL deleter this thread took: a crash at
 * address 0 names it when the register does not. */
void *cs_dl_last_null(void);
void cs_dl_took_null(void *mt);

/* A tracked tensor was released while its capsule still had an unconsumed
 * name, or a capsule was given one again: the capsule hooks must look
 * unconsumed reads up from then on. */
extern _Atomic int cs_dl_unconsumed_released;

/* A struct wrapped before the call that lends it and born when that call
 * returns (the exchange API's to_py, xapi.c): if its deleter runs inside
 * the call, the trampoline has it born first, through `born`. */
typedef struct cs_dl_pending_t {
    void *mt;
    void (*born)(void *mt);
} cs_dl_pending_t;
extern __thread cs_dl_pending_t cs_dl_pending __attribute__((tls_model("initial-exec")));

#endif
