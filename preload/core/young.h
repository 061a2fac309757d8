/* NumPy blocks (young.c) and DLPack tensors (young_dl.c) judged on the
 * thread that made them.
 *
 * Most NumPy blocks are temporaries: made and freed on one thread, through
 * one handler, microseconds apart. A block lives in its thread's own table
 * from its alloc to its free, and a clean free (R28: through the handler,
 * ctx and functions that made it) retires the pair into the thread's table
 * of freed blocks, where a second free (R29) finds it. Whatever else
 * concerns such a block first moves it into the lifecycle's table
 * (cs_young_adopt, cs_young_flush), which then judges it exactly as if it
 * had been there all along. A DLPack tensor exported, consumed and deleted
 * on one thread is judged the same way. */
#ifndef CAPSAN_YOUNG_H
#define CAPSAN_YOUNG_H
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "lifecycle.h"
#include "thread.h"
#include "tracefmt.h"

/* Start judging blocks here (not with record_all: every event goes to the
 * trace as judged). */
void cs_young_init(cs_lifecycle *lc);
/* An NP_ALLOC with a handler, its stack captured (cs_emit_begin): kept
 * on its thread, stamped with its time; 0 if it must go to the lifecycle. */
int cs_young_alloc(cs_thread *t, cs_event *ev);
/* An NP_FREE: 1 if it freed a block of this thread's cleanly (retired, with
 * its time); 0 if the lifecycle must judge it (call cs_young_adopt first). */
int cs_young_free(cs_thread *t, cs_event *ev);
/* Before the lifecycle judges or reads the NumPy block at `key`: its
 * latest life, wherever a thread holds it, moves into the lifecycle's table. */
void cs_young_adopt(uint64_t key);
/* Before the lifecycle's live NumPy blocks or DLPack tensors are read
 * (exit, queries, fork): every thread's live ones move into its table. */
void cs_young_flush(void);
/* How many live NumPy blocks and DLPack tensors the threads hold whose
 * latest event came at or after since_ns (an API scope's, with
 * cs_lc_touched_since): read in place, nothing moves to the lifecycle. */
size_t cs_young_touched_since(uint64_t since_ns);
/* fork(): every thread's table locked across it (1 before, 0 after); the
 * caller flushed first. */
void cs_young_fork_lock(int lock);
/* DLPack (young_dl.c): an EXPORT, CONSUME or DELETE, its stack captured:
 * 1 if judged on this thread (origin and found answered as cs_lc_judge
 * would), 0 if the lifecycle must judge it (cs_young_dl_adopt first). */
int cs_young_dl(cs_thread *t, cs_event *ev, cs_event *origin, int *found);
/* Before the lifecycle judges or reads the DLPack tensor at `key`: its
 * latest life, wherever a thread holds it, moves into the lifecycle's
 * table. One load when no thread holds anything at a key like it. */
extern _Atomic uint16_t *cs_young_dl_held;
void cs_young_dl_adopt_slow(uint64_t key);
/* A live tensor a thread's table holds: its origin (the export or birth)
 * and whether it is consumed, read in place (no move). 0: not held. */
int cs_young_dl_peek(uint64_t key, cs_event *origin, int *consumed);
static inline void cs_young_dl_adopt(uint64_t key)
{
    if (cs_young_dl_held &&
        atomic_load_explicit(&cs_young_dl_held[cs_lc_np_live_at(key)], memory_order_relaxed))
        cs_young_dl_adopt_slow(key);
}
/* capsan's own memory that holds block addresses (the leak scan skips it) */
void cs_young_own_memory(void (*fn)(void *ud, const void *p, size_t n), void *ud);

#endif
