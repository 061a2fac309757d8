/* The NumPy blocks pyarrow objects wrap without a copy (pa.array(ndarray),
 * pa.Table.from_pandas(df)): a pyarrow buffer holds the array, out of
 * tp_traverse's sight, so a walk of what Python reaches (pyreach.c) asks
 * the pyarrow objects it met for their buffers. */
#ifndef CAPSAN_PABUFFERS_H
#define CAPSAN_PABUFFERS_H

#include <stddef.h>
#include <stdint.h>

#include "pyapi.h"

/* pyarrow is imported (GIL held) */
int cs_pa_imported(void);
/* a type of pyarrow's whose objects may hold buffers, by its name */
int cs_pa_type(const char *tp_name);
/* For the n objects (pyarrow tables, chunked arrays, record batches,
 * arrays): each block among want (sorted; sizes[i] its bytes) that one of
 * their buffers lies in gets found[i] = how (whatever it was) and where[i]
 * = the buffer's address. Returns how many it set. GIL held; runs
 * pyarrow's getters (columns, chunks, buffers(), address). */
size_t cs_pa_buffers(PyObject_ *const *objs, size_t nobjs, const uint64_t *want,
                     const uint64_t *sizes, size_t n, uint8_t *found, uint8_t how,
                     uint64_t *where);

#endif
