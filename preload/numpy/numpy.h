/* NumPy data memory: the NEP 49 hooks and handler checks (numpy.c,
 * handlers.c, free_hooks.c; what they share: numpy_int.h). The
 * tracing-handler entry points are in capsan.h. */
#ifndef CAPSAN_NUMPY_H
#define CAPSAN_NUMPY_H

#include "capsan.h"
#include "got.h"

extern const cs_hook cs_numpy_hooks[];
extern const int cs_numpy_nhooks;

/* Resolve the originals; 0 if this interpreter lacks them. */
int cs_numpy_init(void);
/* PyCapsule_GetPointer(cap, "mem_handler") just returned `handler`: the
 * next Track/Untrack on this thread is that handler's (numpy's legacy
 * PyDataMem_NEW/FREE, void scalars through its small-block cache and old
 * extensions, track blocks without reading a handler first). Inline: numpy
 * reads its handler twice an array. */
typedef struct cs_np_cur_t {
    const void *cap, *handler;
    int fresh;
    /* what the read's GIL check said (cs_check_gil): numpy's Track or
     * Untrack follows on the same thread, its allocator call between, so
     * a GIL held at the read is held there and is not asked again */
    unsigned gil;
} cs_np_cur_t;
extern __thread cs_np_cur_t cs_np_cur __attribute__((tls_model("initial-exec")));
void cs_np_new_handler(const void *handler); /* another than this thread's last */
static inline void cs_np_note_handler(const void *cap, const void *handler, unsigned gil)
{
    cs_np_cur.cap = cap;
    cs_np_cur.fresh = 1;
    cs_np_cur.gil = gil;
    if (handler != cs_np_cur.handler)
        cs_np_new_handler(handler);
}
/* A managed struct just exported as a CPU tensor: if its data came from
 * a handler declared for another device, say so. Reads nothing unless
 * some handler declared a device. */
void cs_np_check_export_device(const void *mt, int versioned);
/* After dlclose: forget handlers whose code was unloaded. */
void cs_np_after_dlclose(void);

#endif
