/* The exchange API's non-owning views (rulebook-seams R53): the DLTensor
 * dltensor_from_py_object_no_sync fills is valid while the C call that
 * made it lasts. Each view is watched through its data (dataguard.c): a
 * free of that data while the call lasts, on any thread, is
 * dlpack-stale-view; a free after it returned is legal, unless the
 * caller kept the DLTensor off its stack (static or heap) and it still
 * describes that data then: a view kept past its call. */
#ifndef CAPSAN_XVIEW_H
#define CAPSAN_XVIEW_H

#include <stdint.h>

/* A view was made by a call from Python (gil: held), into out, of data
 * [data, data + nbytes). flags: cs_emit's GIL flags. */
void cs_xview_born(const void *out, uint64_t data, uint64_t nbytes, uint8_t flags, int gil);
/* key is one of capsan's view slots (or the watch of a kept view's
 * DLTensor) */
int cs_xview_is_view(uint64_t key);
/* A free() (how: CS_FREED_*) of the block at p holds key's watched start:
 * the view's data (a finding if the view is still valid, or kept) or a
 * kept view's DLTensor (the view ends). Called before the free runs. */
void cs_xview_freed(uint64_t key, uintptr_t p, unsigned how);

#endif
