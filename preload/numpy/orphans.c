/* R28 at the moment a handler dies: free() of its struct or its ctx
 * (handlers.c's note_ctx_free) makes every block it still owns stale
 * then. Each is told at once (CS_EV_NP_ORPHAN, with the stack of that
 * free()), not at its own free through the dead handler: numpy's first
 * such free may crash the program (the struct reused) before a later
 * block's free is ever judged. */
#include "numpy_int.h"

#include "growclean.h"
#include "runtime.h"
#include "thread.h"
#include "young.h"

void cs_np_orphans(const void *handler, uint32_t why)
{
    cs_thread *t = cs_thread_get();
    /* capsan's own free() (t->busy) of an address a handler once had is
     * not the program's: its blocks are judged at their frees as before */
    if (!handler || !cs_lc || !cs_recording || !t || t->busy)
        return;
    cs_young_flush(); /* the blocks still on their threads too */
    uint64_t *keys = NULL;
    size_t n = cs_lc_live_from(cs_lc, CS_NS_NUMPY, (uint64_t)(uintptr_t)handler, 0, &keys);
    uint32_t stack = 0;
    for (size_t i = 0; i < n; i++) {
        cs_event ev = {.kind = CS_EV_NP_ORPHAN, .obj = keys[i], .extra = why, .stack = stack,
                       .c = (uint64_t)(uintptr_t)handler};
        cs_emit(&ev, !stack, NULL, NULL); /* one free(), one stack for all */
        stack = ev.stack;
    }
    if (keys)
        cs_free_clean(keys, n * sizeof *keys); /* a stale key in freed memory is a root at exit */
}
