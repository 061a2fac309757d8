/* The marks bench/icount.py counts between: a workload calls
 * capsan_bench_loop_starts() (bench/loopmark.py) just before its loop and
 * capsan_bench_loop_ends() just after it. Under `valgrind --tool=callgrind
 * --instr-atstart=no`, callgrind starts counting at the first, so the
 * simulated start-up (import torch: tens of seconds) runs uninstrumented,
 * and the second dumps what the loop executed as a part of its own (the
 * exit then goes to the final dump). Outside valgrind each client request
 * is a few instructions that do nothing. */
#include <valgrind/callgrind.h>

void capsan_bench_loop_starts(void);
void capsan_bench_loop_ends(void);

void capsan_bench_loop_starts(void) {
    CALLGRIND_START_INSTRUMENTATION;
}

void capsan_bench_loop_ends(void) {
    CALLGRIND_DUMP_STATS_AT("loop");
}
