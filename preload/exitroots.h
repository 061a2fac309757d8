/* What the Python threads still running at a normal exit hold. CPython's
 * finalization abandons a daemon thread's frames: the arrays they reach
 * are never freed, yet the program did not leak them. At the interpreter's
 * atexit time (the threads still there, Python alive) capsan walks from
 * each other thread's frames (pyreach.c) and notes the live NumPy blocks
 * they reach, for the exit's verdicts (ending.c). Only under LD_PRELOAD:
 * API mode judges no leak at exit. */
#ifndef CAPSAN_EXITROOTS_H
#define CAPSAN_EXITROOTS_H

#include <stddef.h>
#include <stdint.h>

#include "lifecycle.h"

/* Once numpy is imported (GIL held): have the walk run at atexit. */
void cs_exitroots_arm(void);
/* The blocks the walk found, with the capsan number of the thread whose
 * frames reach each (0: a thread that made no event); malloc'd, the
 * caller frees; returns how many. */
size_t cs_exitroots_held(cs_lc_held **out);

#endif
