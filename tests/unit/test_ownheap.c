/* Unit tests of preload/core/ownheap.c, the runtime's own heap: every size
 * gets a class that holds it and no class a quarter larger than needed, a
 * freed block is handed out again, calloc clears a reused block, realloc
 * keeps the bytes, large blocks are mappings of their own, a block freed
 * twice or a pointer that is not the heap's leaves the lists intact, the
 * heap's mappings (cs_oh_own_memory) cover every block, threads allocating
 * at once never get the same block, and a fork with the locks held leaves
 * a child that allocates. */
#include <fcntl.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "check.h"

#include "../../preload/core/ownheap.c"

static void classes(void)
{
    for (size_t n = 0; n <= MAX_SMALL; n++) {
        unsigned c = class_of(n);
        size_t sz = class_size(c);
        CHECK(c < NCLASS && sz >= n, "size %zu: class %u of %zu bytes", n, c, sz);
        CHECK(sz % 16 == 0, "class %u: %zu bytes", c, sz);
        CHECK(n <= 16 || sz <= n + n / 4 + 16, "size %zu: class of %zu bytes", n, sz);
        CHECK(c == 0 || class_size(c - 1) < n, "size %zu: class %u, %u would hold it", n, c, c - 1);
    }
    CHECK(class_of(MAX_SMALL) == NCLASS - 1, "the last class is %u", class_of(MAX_SMALL));
}

static void reuse(void)
{
    void *a = cs_oh_malloc(100);
    CHECK(a && ((uintptr_t)a & 15) == 0, "malloc(100) = %p", a);
    cs_oh_free(a);
    void *b = cs_oh_malloc(112); /* the same class */
    CHECK(b == a, "a freed block is reused: %p then %p", a, b);
    memset(b, 0xab, 112);
    cs_oh_free(b);
    unsigned char *z = cs_oh_calloc(7, 16);
    CHECK(z == b, "calloc takes the freed block: %p", (void *)z);
    int clear = 1;
    for (int i = 0; z && i < 112; i++)
        clear &= z[i] == 0;
    CHECK(clear, "calloc clears a reused block");
    cs_oh_free(z);
    CHECK(cs_oh_calloc(SIZE_MAX / 8, 16) == NULL, "calloc's overflow is refused");
}

static void grow(void)
{
    char *p = cs_oh_malloc(10);
    strcpy(p, "123456789");
    for (size_t n = 16; n <= ((size_t)1 << 22); n *= 2) {
        p = cs_oh_realloc(p, n);
        CHECK(p && !strcmp(p, "123456789"), "realloc to %zu keeps the bytes", n);
        CHECK(cs_oh_usable(p) >= n, "realloc to %zu: %zu usable", n, cs_oh_usable(p));
        if (!p)
            return;
        memset(p + 10, 'x', n - 10); /* all of it is writable */
    }
    p = cs_oh_realloc(p, 20);
    CHECK(p && !strncmp(p, "123456789", 9), "realloc down to a small class keeps the bytes");
    CHECK(cs_oh_realloc(p, 0) == NULL, "realloc to 0 frees");
    char *s = cs_oh_strdup("capsan");
    CHECK(s && !strcmp(s, "capsan"), "strdup");
    cs_oh_free(s);
    cs_oh_free(NULL);
}

static void large(void)
{
    unsigned char *a = cs_oh_calloc(1, 5 << 20);
    CHECK(a && hdr_of(a)->cls == OH_LARGE, "5 MiB is a mapping of its own");
    int clear = 1;
    for (size_t i = 0; a && i < (5u << 20); i += 4096)
        clear &= a[i] == 0;
    CHECK(clear, "a large calloc is zero");
    void *b = cs_oh_malloc(MAX_SMALL + 1);
    CHECK(b && hdr_of(b)->cls == OH_LARGE, "just over the largest class");
    cs_oh_free(a);
    cs_oh_free(b);
    CHECK(larges == NULL, "freed large blocks leave the list");
}

static void bad_frees(void)
{
    void *a = cs_oh_malloc(48);
    cs_oh_free(a);
    /* told once on stderr (to /dev/null here), left alone */
    int err = dup(2), null = open("/dev/null", O_WRONLY);
    dup2(null, 2);
    cs_oh_free(a);
    dup2(err, 2);
    close(err);
    close(null);
    CHECK(told_bad == 1, "the second free is told");
    void *x = cs_oh_malloc(48), *y = cs_oh_malloc(48);
    CHECK(x == a && y != a, "a block freed twice is handed out once: %p %p %p", a, x, y);
    uint64_t not_ours[4] = {0, 0, 0, 0};
    cs_oh_free(&not_ours[2]);
    CHECK(cs_oh_malloc(48) != (void *)&not_ours[2], "a foreign pointer never joins a list");
}

typedef struct cover {
    uintptr_t lo[256], hi[256];
    int n;
} cover;

static void note(void *ud, const void *p, size_t n)
{
    cover *c = ud;
    if (c->n < 256) {
        c->lo[c->n] = (uintptr_t)p;
        c->hi[c->n++] = (uintptr_t)p + n;
    }
}

static int covered(const cover *c, const void *p, size_t n)
{
    for (int i = 0; i < c->n; i++)
        if ((uintptr_t)p >= c->lo[i] && (uintptr_t)p + n <= c->hi[i])
            return 1;
    return 0;
}

static void own_memory(void)
{
    void *small[64], *big = cs_oh_malloc(100000);
    for (int i = 0; i < 64; i++)
        small[i] = cs_oh_malloc((size_t)i * 97);
    static cover c;
    cs_oh_own_memory(note, &c);
    int all = covered(&c, big, 100000);
    for (int i = 0; i < 64; i++)
        all &= covered(&c, small[i], (size_t)i * 97);
    CHECK(all, "every block lies in a mapping the scan is told (%d ranges)", c.n);
    for (int i = 0; i < 64; i++)
        cs_oh_free(small[i]);
    cs_oh_free(big);
}

#define THREADS 4
#define ROUNDS 20000

static void *hammer(void *arg)
{
    uintptr_t tag = (uintptr_t)arg;
    void *held[32] = {0};
    long bad = 0;
    for (int r = 0; r < ROUNDS; r++) {
        int k = r % 32;
        if (held[k]) {
            bad += *(uintptr_t *)held[k] != tag; /* nobody else wrote it */
            cs_oh_free(held[k]);
        }
        size_t n = 8 + (size_t)((r * 7919u + tag * 31u) % 3000u);
        held[k] = cs_oh_malloc(n);
        if (held[k])
            *(uintptr_t *)held[k] = tag;
    }
    for (int k = 0; k < 32; k++)
        cs_oh_free(held[k]);
    return (void *)bad;
}

static void threads(void)
{
    pthread_t t[THREADS];
    for (uintptr_t i = 0; i < THREADS; i++)
        pthread_create(&t[i], NULL, hammer, (void *)(i + 1));
    long bad = 0;
    for (int i = 0; i < THREADS; i++) {
        void *r;
        pthread_join(t[i], &r);
        bad += (long)r;
    }
    CHECK(bad == 0, "%ld blocks were handed to two threads", bad);
}

static void forked(void)
{
    cs_oh_fork_lock(1);
    pid_t pid = fork();
    cs_oh_fork_lock(0);
    if (pid == 0) {
        void *p = cs_oh_malloc(64), *q = cs_oh_malloc(1 << 20);
        cs_oh_free(p);
        cs_oh_free(q);
        _exit(p && q ? 0 : 1);
    }
    int st = 0;
    CHECK(pid > 0 && waitpid(pid, &st, 0) == pid && WIFEXITED(st) && WEXITSTATUS(st) == 0,
          "a child forked with the locks held allocates (status %d)", st);
}

int main(void)
{
    classes();
    reuse();
    grow();
    large();
    bad_frees();
    own_memory();
    threads();
    forked();
    printf("test_ownheap: %d passed, %d failed\n", checks - failures, failures);
    return failures != 0;
}
