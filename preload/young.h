/* NumPy blocks judged on the thread that made them (young.c).
 *
 * Most NumPy blocks are temporaries: made and freed on one thread, through
 * one handler, microseconds apart. A block lives in its thread's own table
 * from its alloc to its free, and a clean free (R28: through the handler,
 * ctx and functions that made it) retires the pair into the thread's table
 * of freed blocks, where a second free (R29) finds it. Whatever else
 * concerns such a block first moves it into the lifecycle's table
 * (cs_young_adopt, cs_young_flush), which then judges it exactly as if it
 * had been there all along. */
#ifndef CAPSAN_YOUNG_H
#define CAPSAN_YOUNG_H
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
/* Before the lifecycle's live NumPy blocks are read (exit, queries, fork):
 * every thread's live blocks move into its table. */
void cs_young_flush(void);
/* fork(): every thread's table locked across it (1 before, 0 after); the
 * caller flushed first. */
void cs_young_fork_lock(int lock);
/* capsan's own memory that holds block addresses (the leak scan skips it) */
void cs_young_own_memory(void (*fn)(void *ud, const void *p, size_t n), void *ud);

#endif
