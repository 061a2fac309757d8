/* What the arrow*.c files share, private to them: the structs' layouts
 * and capsan's record of an exported struct (its pool: arrow_rec.c).
 * is_rec is inline: every release and stream callback asks it. */
#ifndef CAPSAN_ARROW_INT_H
#define CAPSAN_ARROW_INT_H

#include <stdatomic.h>
#include <stdint.h>

#include "arrow.h"
#include "probe.h"
#include "tracefmt.h"

/* ---- the structs, x86-64 (C Data, C Stream and C Device interfaces) ----
 * size: what a callback's copy holds (a device array's release gets its
 * embedded ArrowArray); full: what is read at wrap time */
typedef struct layout {
    uint8_t size, full, rel, pd;
    uint8_t stream;            /* get_schema, get_next, get_last_error at sch, sch+8, sch+16 */
    uint8_t sch;
} layout;

static const layout lay[6] = {
    [CS_AR_SCHEMA] = {72, 72, 56, 64, 0, 0},
    [CS_AR_ARRAY] = {80, 80, 64, 72, 0, 0},
    [CS_AR_STREAM] = {40, 40, 24, 32, 1, 0},
    [CS_AR_DEVICE_ARRAY] = {80, 128, 64, 72, 0, 0},
    [CS_AR_DEVICE_STREAM] = {48, 48, 32, 40, 1, 8},
};
#define FIELD(s, off) (*(void **)((char *)(s) + (off)))

/* ---- records: one per exported struct, its identity through moves ---- */
#define AR_MAGIC 0x63617073616e4152ull /* "RAnaspac" */

typedef struct ar_rec {
    uint64_t magic;
    struct ar_rec *next_free;
    uint8_t type;              /* cs_ar_type */
    _Atomic uint8_t wrapping;  /* the trampolines are (being) put in */
    _Atomic uint8_t wrapped;
    _Atomic uint8_t released;  /* its release ran */
    _Atomic uint8_t misuse_said;
    _Atomic uint8_t done;      /* DONE_*: both set, the record may be reused */
    void *home;                /* the struct it was wrapped in */
    void *pd, *release;        /* the producer's private_data and release */
    void *fn[3];               /* a stream's get_schema, get_next, get_last_error */
    _Atomic uint32_t in_call;  /* threads inside its stream callbacks */
    _Atomic uint32_t call_thread;
    PyObject_ *cap;            /* its capsule while that lives */
    /* arrow_deep=1: the records of its children and dictionary (R44), each
     * a kid: no object of the lifecycle's, and no event unless something
     * goes wrong, which is said about the exported struct, its root */
    struct ar_rec *kids, *sib; /* its kids; the next of its parent's */
    struct ar_rec *root;       /* a kid's exported struct */
    int32_t idx;               /* a kid's index among its parent's children, -1 the dictionary */
    void *at;                  /* a stream's holder, last called through (arrow_home.c) */
    _Atomic uint8_t data_said; /* a stream's batch data address was told */
    uint8_t kid;
    uint8_t expect;            /* its parent's release must release it (set as that starts) */
    uint8_t byaddr;            /* BA_*: handed over by address (byaddr.c) */
    const void *maker;         /* where PyCapsule_New was called (its module: the maker) */
    void *rel_at;              /* the struct its release ran on (R45: called through again?) */
} ar_rec;
#define BA_BORN 1u     /* born by address: no capsule, its holder owns it */
#define BA_IMPORTED 2u /* moved into an importer by address */
#define BA_SHALLOW 4u  /* first met at an import: its children are not followed (their
                        * owner may be a struct capsan never saw: duckdb hands pyarrow a
                        * copy of a schema whose release leaves the children to it) */
#define BA_MOVED 8u    /* a kid moved out of its parent: an object of its own from then on */
#define DONE_CAPSULE 1u  /* its capsule is gone (or it never had one) */
#define DONE_RELEASED 2u /* released, or nothing will release it through capsan */
#define DONE_PARENT 4u   /* a kid's parent is released: its kids list is not walked again */
#define DONE_ALL (DONE_CAPSULE | DONE_RELEASED | DONE_PARENT)

/* r is a record of capsan's (a struct's private_data may be anything) */
static inline int is_rec(const ar_rec *r)
{
    return r && !((uintptr_t)r & 7) && cs_probe_read(r, sizeof *r) &&
           __atomic_load_n(&r->magic, __ATOMIC_ACQUIRE) == AR_MAGIC && r->type >= CS_AR_SCHEMA &&
           r->type <= CS_AR_DEVICE_STREAM;
}

#endif
