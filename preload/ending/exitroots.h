/* What the program still held as the interpreter began to exit, for the
 * exit's verdicts (ending.c): NumPy blocks that finalization may not free
 * although the program did not leak them. At the interpreter's atexit
 * time (other threads still there, Python alive) capsan notes
 * - the live blocks the frames of each other thread reach (pyreach.c):
 *   finalization abandons a daemon thread's frames;
 * - the live blocks, tensors and Arrow structs the loaded modules' globals
 *   reach, through Python references (held: by those globals when
 *   finalization never cleared them, else by objects that outlived it, such
 *   as pytest's items) or a pyarrow buffer made around an array
 *   (pa.array(ndarray): pyarrow keeps its reference through shutdown on
 *   purpose). What no Python object reached at atexit and is still alive
 *   at exit is the leak (a lost reference);
 * - which other Python threads still run: one join()ed before holds
 *   nothing, although its pthread may end only after the verdict.
 * Only under LD_PRELOAD: API mode judges no leak at exit. */
#ifndef CAPSAN_EXITROOTS_H
#define CAPSAN_EXITROOTS_H

#include <stddef.h>
#include <stdint.h>

#include "lifecycle.h"

/* Once numpy is imported (GIL held): the same as cs_exitroots_arm_threads. */
void cs_exitroots_arm(void);
/* A Python program's first event: have the running threads listed at
 * atexit (cs_exitroots_running), and the walk run there when anything is
 * still alive that the exit would judge */
void cs_exitroots_arm_threads(void);
typedef struct cs_exit_held {
    uint64_t key;
    uint64_t where;  /* the scan: the word that holds it */
    uint32_t thread; /* the walk: the capsan number of the thread whose frames
                      * reach it (0: a thread that made no event) */
    uint16_t region; /* CS_WHERE_THREAD_FRAMES, CS_WHERE_ARROW_BUFFER,
                      * CS_WHERE_MODULE_KEPT, CS_WHERE_PY_REACHED */
    uint8_t ns;      /* CS_NS_NUMPY (a block), CS_NS_DLPACK (a tensor) or
                      * CS_NS_ARROW (a struct's record) */
    uint32_t module; /* MODULE_KEPT: its module's witness + 1 */
} cs_exit_held;

/* Was this Python thread (capsan number) running at atexit? 1 when the
 * atexit walk did not run (nothing to tell it by). */
int cs_exitroots_running(uint32_t thread);

/* What was found and still holds at exit (a module's globals: never
 * cleared); cs_malloc'd, the caller cs_frees; returns how many. */
size_t cs_exitroots_held(cs_exit_held **out);

#endif
