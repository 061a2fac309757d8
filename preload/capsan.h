/* libcapsan.so's public entry points (everything else is hidden).
 *
 * LD_PRELOAD=libcapsan.so starts the runtime from its constructor ("preload
 * mode": exit-time leak check, summary and exit status, as LeakSanitizer).
 * A process that loads the library later (`import capsan`, through
 * ctypes.PyDLL so the GIL is held) calls capsan_start() ("API mode": the
 * same tracing, but findings are read through capsan_findings_json and the
 * exit status is left alone). CAPSAN_OPTIONS is read once, at start. */
#ifndef CAPSAN_H
#define CAPSAN_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define CAPSAN_API __attribute__((visibility("default")))

struct _object; /* PyObject */

/* Start tracing: patch every loaded object and every later one. Returns 1
 * when tracing, 0 when the host is not a Python process. Idempotent. */
CAPSAN_API int capsan_start(void);
/* Stop recording for good and restore every patched slot. Wrapped
 * destructors, deleters and tracing handlers keep forwarding to the
 * originals. capsan_start does not start it again, and the exit has no
 * leak check (the releases after the stop are not seen). */
CAPSAN_API void capsan_stop(void);
/* Called, doing nothing, before each error finding is reported: a
 * debugger's breakpoint (`break __capsan_report_error`, as ASan's
 * __asan_report_error). With abort_on_error=1 the process then raises
 * SIGABRT once the report is printed. */
CAPSAN_API void __capsan_report_error(void);
/* 1 while recording. */
CAPSAN_API int capsan_active(void);
/* 1 once capsan_stop stopped a recording runtime. */
CAPSAN_API int capsan_stopped(void);
/* 1 when started by LD_PRELOAD (exit report and exit status are capsan's). */
CAPSAN_API int capsan_preloaded(void);

/* Findings reported so far in this process (suppressed ones excluded): a
 * cursor for capsan_findings_json. */
CAPSAN_API uint64_t capsan_findings_count(void);
/* The findings after the first `since` ones, as a JSON array of the
 * contract's finding objects (kind, severity, message, object, bytes,
 * events with merged stacks), from capsan's own heap: release it with
 * capsan_free, never free(). */
CAPSAN_API char *capsan_findings_json(uint64_t since);
CAPSAN_API void capsan_free(void *p);

/* A new "mem_handler" capsule (version 1) whose functions forward to
 * `inner` (a mem_handler capsule; NULL = numpy's current handler). Blocks
 * it allocates are attributed to it. GIL held. A new reference, or NULL
 * with a Python exception set. */
CAPSAN_API struct _object *capsan_handler_new(struct _object *inner);
/* numpy's PyDataMem_SetHandler for the current context (NULL = numpy's
 * default): returns the previous handler (new reference) or NULL with an
 * exception set. GIL held. */
CAPSAN_API struct _object *capsan_set_handler(struct _object *handler);
/* numpy's PyDataMem_GetHandler (new reference). GIL held. */
CAPSAN_API struct _object *capsan_get_handler(void);
/* Judge the blocks allocated through `handler` (from capsan_handler_new)
 * that are still live: each becomes a numpy-leak finding now. Returns how
 * many. Call after gc.collect(). GIL held. */
CAPSAN_API int capsan_handler_leaks(struct _object *handler);
/* The same, except the n blocks of `held` (sorted addresses): ones that a
 * Python object outside the scope still refers to. */
CAPSAN_API int capsan_handler_leaks_except(struct _object *handler, const uint64_t *held, size_t n);
/* The same for the blocks allocated at or after since_ns (capsan_now_ns):
 * a handler that serves one scope after another (the pytest plugin's). */
CAPSAN_API int capsan_handler_leaks_since(struct _object *handler, uint64_t since_ns,
                                          const uint64_t *held, size_t n);
/* The addresses of the blocks capsan_handler_leaks would judge, sorted:
 * up to max of them into out; returns how many there are. GIL held. */
CAPSAN_API size_t capsan_handler_live(struct _object *handler, uint64_t *out, size_t max);
/* The same for the blocks allocated at or after since_ns. */
CAPSAN_API size_t capsan_handler_live_since(struct _object *handler, uint64_t since_ns,
                                            uint64_t *out, size_t max);
/* Which of want[0..n) (sorted block addresses) an array or an unconsumed
 * DLPack capsule reachable from `roots` holds: found[i] = 1 for each;
 * returns how many. GIL held (see pyreach.h). */
CAPSAN_API int capsan_reached(struct _object *roots, const uint64_t *want, size_t n, uint8_t *found);
/* The clock the runtime stamps events with (CLOCK_MONOTONIC ns): a scope's
 * start, for capsan_scope_dlpack_leaks. */
CAPSAN_API uint64_t capsan_now_ns(void);
/* Judge the DLPack tensors consumed since `since_ns` and still unreleased:
 * each one whose address is stored nowhere in the process's memory any
 * more is a dlpack-leak finding now (with the consumer's Python line), the
 * NumPy buffer it keeps alive its indirect part. Returns how many. Call
 * after gc.collect(). GIL held. */
CAPSAN_API int capsan_scope_dlpack_leaks(uint64_t since_ns);
/* How many live NumPy blocks, DLPack tensors and Arrow structs had their
 * latest event at or after since_ns (made, consumed, moved...): 0 means a
 * scope that began then has nothing left to judge, and needs no
 * gc.collect() to find out. A walk of the runtime's table and of each
 * thread's young objects, nothing moved, no allocation. */
CAPSAN_API uint64_t capsan_scope_live(uint64_t since_ns);
/* The addresses of those that are NumPy blocks or DLPack tensors, sorted
 * and distinct (what capsan_reached looks for): up to max of them into
 * out; returns how many there are. GIL held. */
CAPSAN_API size_t capsan_scope_live_keys(uint64_t since_ns, uint64_t *out, size_t max);
/* Declare the DLPack device type (e.g. 3, kDLCUDAHost) of the memory a
 * handler hands out: exporting its data as plain CPU (device type 1) is then
 * reported as dlpack-device-mismatch. Handler names containing "cuda_host"
 * or "pinned" are taken as kDLCUDAHost without this call. 0 or -1. */
CAPSAN_API int capsan_handler_set_device(struct _object *handler, int device_type);

/* What capsan's wrappers stand for: a capsule's own destructor, and a
 * DLManagedTensor's own deleter (NULL when unknown). For inspection. */
CAPSAN_API void *capsan_original_destructor(struct _object *capsule);
CAPSAN_API void *capsan_original_deleter(void *managed_tensor);
/* A capsule's pointer, read with its current name, without recording an
 * event (inspection is not consumption). GIL held; NULL with an exception
 * set when it is not a valid capsule. */
CAPSAN_API void *capsan_capsule_peek(struct _object *capsule);

/* DLPack 1.3's exchange API: follow a DLPackExchangeAPI table found
 * outside a capsule read (a type's __c_dlpack_exchange_api__ int, or a
 * table a consumer cached before capsan started): validated and patched
 * in place where writable. Returns what a reader should use (the table,
 * or capsan's forwarding shadow). */
CAPSAN_API void *capsan_xapi_follow(void *table);
/* Entry `entry` of a table as its producer made it (1 allocator, 2
 * from_py, 3 to_py, 4 view, 5 stream), also when capsan patched it. */
CAPSAN_API void *capsan_xapi_original(const void *table, int entry);

/* An Arrow struct capsan follows (type: 1 schema, 2 array, 3 stream, 4
 * device array, 5 device stream): what the producer put in its release
 * (what 0) or private_data (what 1), which capsan's record stands in for;
 * NULL when capsan does not follow it. For inspection. */
CAPSAN_API void *capsan_arrow_original(const void *s, int type, int what);
/* The Arrow struct capsan follows at address s, by capsule or by address
 * (capsan.describe(int)): its type (as above) | CS_AT_* bits; 0 when
 * capsan follows none there. */
#define CS_AT_RELEASED 0x100 /* its release ran (through some copy) */
#define CS_AT_EMPTY 0x200    /* release == NULL here: moved out or released */
#define CS_AT_BY_ADDR 0x400  /* handed over by address (R49), no capsule */
#define CS_AT_IMPORTED 0x800 /* moved into an importer by address */
#define CS_AT_CAPSULE 0x1000 /* its capsule is alive */
#define CS_AT_CHILD 0x2000   /* a child or dictionary of one (arrow_deep=1) */
CAPSAN_API int capsan_arrow_at(const void *s);

#ifdef __cplusplus
}
#endif

#endif
