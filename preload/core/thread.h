/* Per-thread runtime state, reached through one initial-exec TLS pointer
 * (small, so it fits the static TLS surplus when libcapsan.so is
 * dlopen'ed by `import capsan`). */
#ifndef CAPSAN_THREAD_H
#define CAPSAN_THREAD_H

#include <stddef.h>
#include <stdint.h>
#include "tracefile.h"

struct cs_stack_cache;
struct cs_young;

typedef struct cs_thread {
    uint32_t num;           /* capsan's thread number, 1 = first seen */
    uint32_t written_gen;   /* trace generation its THREAD record is in */
    int busy;               /* inside capsan: hooks pass straight through */
    void *dtor_capsule;     /* capsule whose destructor runs on this thread */
    void *dtor_mt;          /* the pointer it held as its destructor began: a
                             * release of another struct inside it is not that
                             * capsule's (its address may be a dead one's) */
    void *predicted;        /* the released struct that destructor was judged
                             * about to delete again (capsule_dtor.c), and */
    void *predicted_fn;     /* the deleter that call is forwarded to */
    struct cs_stack_cache *cache;
    struct cs_young *young; /* its NumPy blocks judged on it (young.c) */
    int importing;          /* the last captured stack ran inside an import */
    const char *py_rest;    /* the first Python frame it did not record (NULL:
                             * none left); valid during its event only */
    int py_walked;          /* py_rest was set by that capture */
    int python;             /* made an event holding the GIL: a Python thread */
    int stayed;             /* in a forked child: a thread that stayed in the parent */
    unsigned long pthread;  /* pthread_self(): Python's thread ident */
    struct cs_thread *next, *prev; /* the registry of threads not yet exited */
} cs_thread;

extern __thread cs_thread *cs_thread_tls __attribute__((tls_model("initial-exec")));
/* free() and PyMem_Free() calls this thread made (wrapping): a deleter
 * that ran during interpreter shutdown and made none released nothing */
extern __thread unsigned cs_frees __attribute__((tls_model("initial-exec")));
cs_thread *cs_thread_make(void);
void cs_thread_write(cs_thread *t);

/* This thread's state, created on first use; NULL if out of memory. */
static inline cs_thread *cs_thread_get(void)
{
    cs_thread *t = cs_thread_tls;
    return t ? t : cs_thread_make();
}

/* Write the THREAD record into the current trace file if not there yet. */
static inline void cs_thread_note(cs_thread *t)
{
    if (t->written_gen != cs_trace_gen())
        cs_thread_write(t);
}
void cs_thread_init(void);
/* Called as a thread ends (its state still whole), if set (young.c) */
extern void (*cs_thread_on_exit)(cs_thread *t);
/* The capsan numbers of the Python threads (those that made an event with
 * the GIL), other than the caller, that have not exited or that the
 * interpreter's finalization ended (or, in a forked child, that stayed in
 * the parent): at exit, threads which may still hold what they made or
 * took. running (NULL: any): whether a thread of this process still ran
 * Python (one join()ed may end its pthread late); a thread that stayed in
 * the parent counts whatever it says. At most max into out; returns how
 * many there are. */
size_t cs_thread_python_left(uint32_t *out, size_t max, int (*running)(uint32_t num));
/* The capsan number of the listed thread whose pthread_self() (Python's
 * thread ident) is `pthread`, or 0 if none is listed. */
uint32_t cs_thread_num_of(unsigned long pthread);
/* fork(): the registry's lock held across it (1 before, 0 after, in the
 * parent and the child). The child keeps the other threads listed: they
 * did not come along, but their frames did, abandoned (CPython deletes
 * their thread states without clearing them), with all they hold; they
 * never exit there, and those that ran Python count as holding it */
void cs_thread_fork_lock(int lock);
/* In the child, instead of cs_thread_fork_lock(0): the other threads are
 * marked as having stayed in the parent (their frames and what they hold
 * came along, abandoned), and the lock let go. */
void cs_thread_fork_child(void);

#endif
