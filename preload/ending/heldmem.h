/* The memory library objects hold where tp_traverse cannot see, for the
 * walk of what Python reaches (pyreach.c): a pyarrow buffer made around a
 * NumPy array without a copy (pa.array(ndarray), pa.Table.from_pandas) and
 * a torch tensor's data (torch.from_dlpack, torch.from_numpy) are C++
 * references. The walk collects such objects; their addresses come from
 * the libraries' own getters once it is done. */
#ifndef CAPSAN_HELDMEM_H
#define CAPSAN_HELDMEM_H

#include <stddef.h>
#include <stdint.h>

#include "pyapi.h"

typedef enum cs_held_lib { CS_HELD_NONE = 0, CS_HELD_PYARROW, CS_HELD_TORCH, CS_HELD_TVM_FFI } cs_held_lib;

/* What the walk must collect: call once per walk (GIL held): which of the
 * libraries are imported, and torch's tensor type. */
typedef struct cs_heldmem {
    int pyarrow;
    const void *torch_tensor; /* torch._C.TensorBase (_TensorBase before 2.3), or NULL */
    const void *ffi_object;   /* tvm_ffi.core.CObject: its tensors and containers, or NULL */
    uintptr_t torch_base, ffi_base; /* the libraries those types live in (dladdr) */
} cs_heldmem;
/* Whether an object of lib holds the DLPack tensor that the code at
 * consumer (a return address; CS_LC_WHO_XFROM: an exchange-API caller)
 * consumed: the library's own objects hold what it consumes, and the
 * producer's objects (pyarrow's, a torch tensor exported) do not. */
int cs_heldmem_consumed_by(const cs_heldmem *h, cs_held_lib lib, uint64_t consumer);
void cs_heldmem_init(cs_heldmem *h);
/* Whether objects of type tp hold memory this way, and whose. */
cs_held_lib cs_heldmem_lib(const cs_heldmem *h, const void *tp, const char *tp_name);
/* Each address object o holds: every buffer of a pyarrow table, chunked
 * array, record batch or array; a torch tensor's data_ptr(); a tvm-ffi
 * tensor's data_ptr(), or those of a tvm-ffi Array, List or Map's. Runs the
 * libraries' getters (GIL held). */
void cs_heldmem_addresses(PyObject_ *o, cs_held_lib lib, void (*cb)(uint64_t addr, void *ud),
                          void *ud);

#endif
