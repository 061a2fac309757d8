/* tvm-ffi's function calls around exchange-table conversions (R51 judged
 * at the FFI call): a call that fails with its error raised through the
 * FFI's error API (TVMFFIErrorSetRaised*), made after its arguments were
 * converted through a table, must have that error fetched
 * (TVMFFIErrorMoveFromRaised) before the Python call that made it
 * returns; else the caller lost it (dlpack-exchange-contract), said at
 * the next FFI call, raise or fetch, or at the thread's or process's end. */
#ifndef CAPSAN_XFFI_H
#define CAPSAN_XFFI_H

#include "got.h"

/* conversions through a table on this thread (from_py, view): one
 * increment per entry call */
extern __thread unsigned cs_xconv __attribute__((tls_model("initial-exec")));

/* The process ends (its exiting thread): a noted failure of this thread
 * whose Python call returned without fetching its error is reported. */
void cs_xffi_end(void);

extern const cs_hook cs_xffi_hooks[];
extern const int cs_xffi_nhooks;

#endif
