/* NumPy data memory: the NEP 49 hooks and handler checks (numpy.c). The
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
 * next Track/Untrack on this thread is that handler's. */
void cs_np_note_handler(const void *cap, const void *handler);
/* A tensor exported as device `devtype` with its data at `data`: if that
 * data came from a handler declared for another device, say so. */
void cs_np_check_export_device(uint64_t mt, uint64_t data, int devtype);
/* a handler declared a device other than the CPU: exports are checked */
extern int cs_np_any_device;
/* After dlclose: forget handlers whose code was unloaded. */
void cs_np_after_dlclose(void);

#endif
