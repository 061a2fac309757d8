/* Whether foreign memory can be touched: a capsule may carry any pointer,
 * and a DLTensor any shape or strides pointer. A fault there would be
 * capsan's, not the program's. */
#ifndef CAPSAN_PROBE_H
#define CAPSAN_PROBE_H

#include <stddef.h>

/* 1 if the n bytes at p can be read. Pages once proven readable are
 * remembered, so the usual case is a compare; a miss asks the kernel
 * (process_vm_readv fails with EFAULT where a load would fault). */
int cs_probe_read(const void *p, size_t n);
/* *slot = val, unless slot cannot be written (then 0 and nothing done). */
int cs_probe_store(void **slot, void *val);

#endif
