/* Reading DLPack structs defensively: the field checks of rulebook
 * R13-R21, the tensor's byte size, and a fingerprint of the loaned
 * metadata (R20). The layouts are x86-64 DLPack 0.6 / 1.x. */
#ifndef CAPSAN_DLTENSOR_H
#define CAPSAN_DLTENSOR_H

#include <stdint.h>

#define CS_DL_DELETER_OFF 56        /* DLManagedTensor.deleter */
#define CS_DLV_DELETER_OFF 16       /* DLManagedTensorVersioned.deleter */
#define CS_DLV_TENSOR_OFF 32        /* DLManagedTensorVersioned.dl_tensor */
#define CS_DL_BYTE_OFFSET_OFF 40    /* DLTensor.byte_offset */

typedef struct cs_dl_problem {
    uint32_t rule;   /* 13..21 */
    uint32_t code;   /* CS_BAD_* */
    int64_t value;
} cs_dl_problem;

/* Check a managed struct; fills up to max problems, returns their count.
 * *nbytes gets the data size (0 if unknown), *fingerprint the metadata
 * hash, *data dl_tensor.data. Never reads memory the probes (probe.h) did not prove readable. */
int cs_dl_check(const void *mt, int versioned, cs_dl_problem *out, int max, uint64_t *nbytes,
                uint32_t *fingerprint, uint64_t *data);
/* Only the fingerprint (at the delete, to see R20 mutations). */
uint32_t cs_dl_fingerprint(const void *mt, int versioned);
/* What a consume needs, with one probe: the fingerprint (0 if the struct
 * cannot be read), byte_offset in *offset and data in *data. */
uint32_t cs_dl_consume_view(const void *mt, int versioned, uint64_t *offset, uint64_t *data);
/* byte_offset and data alone (a re-export's look at a consumed tensor);
 * 0 if the struct cannot be read. */
int cs_dl_view(const void *mt, int versioned, uint64_t *offset, uint64_t *data);
/* dl_tensor.data of a live struct of either layout (the deleter is told
 * apart by which offset holds capsan's trampoline; 0 if unknown). */
uint64_t cs_dl_data(const void *mt);
int cs_dl_device_type(const void *mt, int versioned);

static inline void **cs_dl_deleter_slot(void *mt, int versioned)
{
    return (void **)((char *)mt + (versioned ? CS_DLV_DELETER_OFF : CS_DL_DELETER_OFF));
}

#endif
