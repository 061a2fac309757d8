/* Names from `capsan symbolize --tsv`, out of process (see outsym.h). */
#include "outsym.h"

#include <errno.h>
#include <fcntl.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "libpath.h"
#include "alloc.h"

#define MAX_ADDRS 512
#define MAX_FRAMES 2048

typedef struct addr {
    uint64_t ip, offset;
    const char *module;
    int first, n; /* its frames in s->frames */
} addr;

struct cs_outsym {
    addr addrs[MAX_ADDRS];
    int naddrs;
    cs_frame_info frames[MAX_FRAMES];
    int nframes;
    char *text; /* the child's output: the frames' strings point into it */
};

cs_outsym *cs_outsym_new(void) { return cs_calloc(1, sizeof(cs_outsym)); }

void cs_outsym_free(cs_outsym *s)
{
    if (s)
        cs_free(s->text);
    cs_free(s);
}

void cs_outsym_want(cs_outsym *s, uint64_t ip, const char *module, uint64_t offset)
{
    if (!s || !module || !*module || s->naddrs == MAX_ADDRS)
        return;
    for (int i = 0; i < s->naddrs; i++)
        if (s->addrs[i].ip == ip)
            return;
    s->addrs[s->naddrs++] = (addr){.ip = ip, .offset = offset, .module = module};
}

static int write_all(int fd, const char *p, size_t n)
{
    while (n) {
        ssize_t k = write(fd, p, n);
        if (k < 0 && errno == EINTR)
            continue;
        if (k <= 0)
            return -1;
        p += k;
        n -= (size_t)k;
    }
    return 0;
}

/* the child's whole output, NUL-terminated, or NULL */
static char *read_all(int fd)
{
    size_t cap = 1 << 14, len = 0;
    char *buf = cs_malloc(cap);
    while (buf) {
        if (len + 1 == cap) {
            char *nb = cs_realloc(buf, cap * 2);
            if (!nb)
                break;
            buf = nb;
            cap *= 2;
        }
        ssize_t k = read(fd, buf + len, cap - 1 - len);
        if (k < 0 && errno == EINTR)
            continue;
        if (k <= 0) {
            buf[len] = 0;
            return buf;
        }
        len += (size_t)k;
    }
    cs_free(buf);
    return NULL;
}

/* "FUNCTION\tFILE\tLINE\tINLINED" lines, an empty line after each address */
static void parse(cs_outsym *s)
{
    char *p = s->text;
    for (int a = 0; a < s->naddrs && p && *p; a++) {
        addr *ad = &s->addrs[a];
        ad->first = s->nframes;
        while (*p && *p != '\n') {
            char *eol = strchr(p, '\n');
            if (eol)
                *eol = 0;
            char *f[4] = {p, NULL, NULL, NULL};
            for (int k = 1; k < 4 && f[k - 1]; k++) {
                char *tab = strchr(f[k - 1], '\t');
                if (tab)
                    *tab = 0;
                f[k] = tab ? tab + 1 : NULL;
            }
            if (f[3] && s->nframes < MAX_FRAMES) {
                cs_frame_info *fr = &s->frames[s->nframes++];
                *fr = (cs_frame_info){.function = *f[0] ? f[0] : NULL,
                                      .file = *f[1] ? f[1] : NULL,
                                      .line = (uint32_t)strtoul(f[2], NULL, 10),
                                      .inlined = f[3][0] == '1',
                                      .module = ad->module,
                                      .address = ad->ip,
                                      .offset = ad->offset};
            }
            p = eol ? eol + 1 : p + strlen(p);
        }
        ad->n = s->nframes - ad->first;
        if (*p == '\n')
            p++;
    }
}

int cs_outsym_run(cs_outsym *s)
{
    const char *cli = cs_cli_path();
    if (!s || !s->naddrs || !cli[0] || access(cli, X_OK) != 0)
        return -1;
    int in[2], out[2];
    if (pipe2(in, O_CLOEXEC) != 0)
        return -1;
    if (pipe2(out, O_CLOEXEC) != 0) {
        close(in[0]), close(in[1]);
        return -1;
    }
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_adddup2(&fa, in[0], 0);
    posix_spawn_file_actions_adddup2(&fa, out[1], 1);
    char *argv[] = {(char *)cli, "symbolize", "--tsv", NULL};
    /* the child must not trace itself */
    char *env[] = {"CAPSAN_CHILD=1", NULL};
    pid_t pid;
    int rc = posix_spawn(&pid, cli, &fa, NULL, argv, env);
    posix_spawn_file_actions_destroy(&fa);
    close(in[0]);
    close(out[1]);
    if (rc != 0) {
        close(in[1]), close(out[0]);
        return -1;
    }
    /* every query first (a few KiB: the pipe holds them), then the answers */
    int ok = 0;
    for (int i = 0; i < s->naddrs && ok == 0; i++) {
        char line[4200];
        int n = snprintf(line, sizeof line, "%s\t%llx\n", s->addrs[i].module,
                         (unsigned long long)s->addrs[i].offset);
        ok = n > 0 && (size_t)n < sizeof line ? write_all(in[1], line, (size_t)n) : -1;
    }
    close(in[1]);
    s->text = read_all(out[0]);
    close(out[0]);
    int st;
    while (waitpid(pid, &st, 0) < 0 && errno == EINTR)
        ;
    if (ok != 0 || !s->text || !WIFEXITED(st) || WEXITSTATUS(st) != 0)
        return -1;
    parse(s);
    return 0;
}

int cs_outsym_frames(const cs_outsym *s, uint64_t ip, cs_frame_info *out, int max)
{
    for (int i = 0; s && i < s->naddrs; i++) {
        if (s->addrs[i].ip != ip)
            continue;
        int n = s->addrs[i].n < max ? s->addrs[i].n : max;
        memcpy(out, &s->frames[s->addrs[i].first], (size_t)n * sizeof *out);
        return n;
    }
    return 0;
}
