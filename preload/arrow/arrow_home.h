/* Where a moved Arrow stream was last called through (its holder), so
 * that a free() of that holder is seen: the struct inside it dies with
 * the block, and its stale bytes must not look like a holder to the scan
 * at exit (an arrow-leak: the holder freed, the stream never released). */
#ifndef CAPSAN_ARROW_HOME_H
#define CAPSAN_ARROW_HOME_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

/* a stream callback ran on the copy at self (r: its record, an ar_rec) */
void cs_ar_home_note(void *r, void *self);
/* r's stream is released: its holder no longer matters */
void cs_ar_home_forget(void *r);
/* homes noted now: free()'s slow path asks cs_ar_home_freed only then */
extern _Atomic uint32_t cs_ar_nhomes;
/* the block [p, p + its size) is being freed by free() */
void cs_ar_home_freed(uintptr_t p);

#endif
