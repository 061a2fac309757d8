/* libcapsan.so's public entry points (everything else is hidden).
 *
 * LD_PRELOAD=libcapsan.so starts the runtime from its constructor; a
 * process that loads the library later (`import capsan`) calls
 * capsan_start(). CAPSAN_OPTIONS is read once, at start. */
#ifndef CAPSAN_H
#define CAPSAN_H

#ifdef __cplusplus
extern "C" {
#endif

/* Start tracing: patch every loaded object and every later one. Returns 1
 * when tracing, 0 when the host is not a Python process. Idempotent. */
__attribute__((visibility("default"))) int capsan_start(void);
/* Stop recording and restore every patched slot. Wrapped destructors and
 * deleters keep forwarding to the originals. */
__attribute__((visibility("default"))) void capsan_stop(void);
/* 1 while recording. */
__attribute__((visibility("default"))) int capsan_active(void);

#ifdef __cplusplus
}
#endif

#endif
