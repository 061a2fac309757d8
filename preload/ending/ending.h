/* The process's ending (ending.c): leak verdicts at exit and _exit, the
 * END record and the exit status; a capsan.trace() scope's unreleased
 * tensors and Arrow structs (capsan_scope_dlpack_leaks, capsan.h). Called
 * by start.c's exit, _exit and stop paths, and by the runtime on
 * halt_on_error (through cs_runtime_halt). */
#ifndef CAPSAN_ENDING_H
#define CAPSAN_ENDING_H

/* Finish the process's trace (leak check when how == CS_END_EXIT; none in
 * API mode or after capsan.stop(), and the END says CS_END_API_EXIT or
 * CS_END_STOPPED_EXIT) and return the exit status to use. Idempotent. */
int cs_ending_finish(int how, int status);
/* halt_on_error: finish as CS_END_HALT and _exit */
void cs_ending_halt(void);
/* capsan.stop() was called: the process's exit has no leak verdict */
void cs_ending_stopped(void);

#endif
