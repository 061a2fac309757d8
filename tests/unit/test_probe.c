/* Unit tests of preload/core/probe.c: unreadable and read-only memory is told
 * from good memory without a fault, and where the kernel refuses to be
 * asked (a seccomp profile, as Docker's default without CAP_SYS_PTRACE)
 * memory is taken as readable rather than everything as bad. */
#include <errno.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "check.h"

#include "probe.h"

/* process_vm_readv and process_vm_writev fail with EPERM from now on */
static int refuse_vm_calls(void)
{
    struct sock_filter f[] = {
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, nr)),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, SYS_process_vm_readv, 2, 0),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, SYS_process_vm_writev, 1, 0),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | EPERM),
    };
    struct sock_fprog prog = {sizeof f / sizeof f[0], f};
    return prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) == 0 &&
           prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &prog) == 0;
}

int main(void)
{
    long pg = sysconf(_SC_PAGESIZE);
    char *map = mmap(NULL, (size_t)pg * 3, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (map == MAP_FAILED || mprotect(map + pg, (size_t)pg, PROT_NONE) != 0 ||
        mprotect(map + 2 * pg, (size_t)pg, PROT_READ) != 0) {
        perror("mmap");
        return 1;
    }
    char *good = map, *none = map + pg, *ro = map + 2 * pg;
    void **heap = malloc(64);

    CHECK(cs_probe_read(good, 64), "a readable page");
    CHECK(cs_probe_read(good, 64), "a readable page, remembered");
    CHECK(!cs_probe_read(none, 8), "a PROT_NONE page");
    CHECK(!cs_probe_read(good + pg - 16, 32), "a range running into a PROT_NONE page");
    CHECK(!cs_probe_read((void *)(uintptr_t)16, 8), "the zero page");
    CHECK(!cs_probe_read((void *)(uintptr_t)0x900000000000ull, 8), "a non-canonical address");
    CHECK(cs_probe_read(ro, 8), "a read-only page can be read");
    CHECK(!cs_probe_store((void **)ro, heap), "a read-only page cannot be stored to");
    CHECK(cs_probe_store(heap, (void *)heap) && heap[0] == (void *)heap, "a heap store");

    if (!refuse_vm_calls()) {
        perror("seccomp");
        return 1;
    }
    char *fresh = malloc(3 * 4096);
    char *page = (char *)(((uintptr_t)fresh + 4095) & ~(uintptr_t)4095);
    CHECK(cs_probe_read(page, 8), "refused by seccomp: a fresh page is taken as readable");
    CHECK(cs_probe_store((void **)page, page) && *(void **)page == page,
          "refused by seccomp: the store is made");
    CHECK(!cs_probe_read((void *)(uintptr_t)16, 8), "refused by seccomp: the zero page still is not");
    free(fresh);
    free(heap);
    munmap(map, (size_t)pg * 3);
    printf("test_probe: %d passed, %d failed\n", checks - failures, failures);
    return failures != 0;
}
