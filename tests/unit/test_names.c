/* Unit tests of preload/core/names.h: every DLPack and Arrow name and its near misses are
 * classified right wherever they sit, and a name that ends on the last byte
 * before an unmapped page, or runs into it with no NUL, is read without a
 * fault. */
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "check.h"

#include "names.h"



static const struct {
    const char *name;
    int kind;
} cases[] = {
    {"dltensor", NK_DL},
    {"dltensor_versioned", NK_DLV},
    {"used_dltensor", NK_USED},
    {"used_dltensor_versioned", NK_USEDV},
    {"numpy_dltensor", NK_NPDL},
    {"numpy_dltensor_versioned", NK_NPDL},
    /* near misses: a byte short, a byte long, one byte changed */
    {"", NK_NONE},
    {"d", NK_NONE},
    {"dltenso", NK_NONE},
    {"dltensorX", NK_NONE},
    {"dltensor_", NK_NONE},
    {"Dltensor", NK_NONE},
    {"dltensoR", NK_NONE},
    {"dltensor_versione", NK_NONE},
    {"dltensor_versioned_", NK_NONE},
    {"used_dltensor_", NK_NONE},
    {"used_dltensoR", NK_NONE},
    {"used_dltensor_versionedX", NK_NONE},
    {"numpy_dltenso", NK_NONE},
    {"numpy_dltensor_v", NK_NONE},
    {"mem_handler", NK_NONE},
    {"torch.Tensor", NK_NONE},
    /* the Arrow PyCapsule interface, and the early drafts' names (no underscore) */
    {"arrow_schema", NK_AR_SCHEMA},
    {"arrow_array", NK_AR_ARRAY},
    {"arrow_array_stream", NK_AR_STREAM},
    {"arrow_device_array", NK_AR_DEVICE_ARRAY},
    {"arrow_device_array_stream", NK_AR_DEVICE_STREAM},
    {"a", NK_NONE},
    {"arrow", NK_NONE},
    {"arrowschema", NK_NONE},
    {"arrowarraystream", NK_NONE},
    {"arrow_arra", NK_NONE},
    {"arrow_array_", NK_NONE},
    {"arrow_array_streaM", NK_NONE},
    {"arrow_device_array_stream_", NK_NONE},
    {"used_arrow_array", NK_NONE},
};

/* PyCapsule_New's question (name_kind_new): R40's near misses of the Arrow
 * names are NK_AR_NEAR there, and nothing to every other hook */
static const struct {
    const char *name;
    int kind;
} near_cases[] = {
    {"arrowschema", NK_AR_NEAR},        /* the early drafts' names (apache/arrow PR 37797) */
    {"arrowarray", NK_AR_NEAR},
    {"arrowarraystream", NK_AR_NEAR},
    {"arrow-array", NK_AR_NEAR},
    {"arrow-schema", NK_AR_NEAR},
    {"arrow-array-stream", NK_AR_NEAR},
    {"arrow_device-array", NK_AR_NEAR},
    {"arrow-device-array-stream", NK_AR_NEAR},
    {"Arrow_Array", NK_AR_NEAR},
    {"ARROW_SCHEMA", NK_AR_NEAR},
    {"arrow_array_streaM", NK_AR_NEAR},
    {"arrow_array_", NK_AR_NEAR},
    {"used_arrow_array", NK_AR_NEAR},
    {"used_arrow_schema", NK_AR_NEAR},
    {"used_arrow_device_array_stream", NK_AR_NEAR},
    /* the exact names keep their kinds, other names are nothing */
    {"arrow_schema", NK_AR_SCHEMA},
    {"arrow_array", NK_AR_ARRAY},
    {"arrow_device_array_stream", NK_AR_DEVICE_STREAM},
    {"used_dltensor", NK_USED},
    {"dltensor", NK_DL},
    {"a", NK_NONE},
    {"A", NK_NONE},
    {"u", NK_NONE},
    {"used", NK_NONE},
    {"used_", NK_NONE},
    {"arrow", NK_NONE},
    {"arrow_arra", NK_NONE},
    {"arrow_array_x", NK_NONE},
    {"arrays", NK_NONE},
    {"Array", NK_NONE},
    {"used_dltensor_", NK_NONE},
    {"used_arrow", NK_NONE},
    {"abc_capsule", NK_NONE},
    {"arrow_array_stream_arrow_array_stream_arrow_array", NK_NONE},
    {"arrow___________________________________________array", NK_NONE}, /* too long */
    {"torch.Tensor", NK_NONE},
    {"_ARRAY_API", NK_NONE},
};

/* name, NUL included, placed `back` bytes before the guard page that
 * follows the page at map (the page filled with 'x' first) */
static const char *at_page_end(char *map, long pg, const char *name, size_t back)
{
    size_t len = strlen(name) + 1;
    char *s = map + pg - len - back;
    memset(map, 'x', (size_t)pg);
    memcpy(s, name, len);
    return s;
}

int main(void)
{
    long pg = sysconf(_SC_PAGESIZE);
    char *map = mmap(NULL, (size_t)pg * 2, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (map == MAP_FAILED || mprotect(map + pg, (size_t)pg, PROT_NONE) != 0) {
        perror("mmap");
        return 1;
    }
    CHECK(name_kind(NULL) == NK_NONE, "NULL");
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        /* the NUL on the page's last byte, then every shift back to 40 bytes
         * before it: both the word-wise and the strcmp path */
        for (size_t back = 0; back <= 40; back++) {
            int k = name_kind(at_page_end(map, pg, cases[i].name, back));
            CHECK(k == cases[i].kind, "\"%s\" %zu bytes before the guard page: %d, not %d",
                  cases[i].name, back, k, cases[i].kind);
        }
    CHECK(name_kind_new(NULL) == NK_NONE, "NULL (PyCapsule_New)");
    for (size_t i = 0; i < sizeof near_cases / sizeof near_cases[0]; i++)
        for (size_t back = 0; back <= 60; back++) {
            const char *s = at_page_end(map, pg, near_cases[i].name, back);
            int k = name_kind_new(s), plain = name_kind(s);
            CHECK(k == near_cases[i].kind, "new \"%s\" %zu bytes before the guard page: %d, not %d",
                  near_cases[i].name, back, k, near_cases[i].kind);
            CHECK(plain == (k == NK_AR_NEAR ? NK_NONE : k), "\"%s\": name_kind %d", near_cases[i].name,
                  plain);
        }
    /* a near miss with no NUL before the guard page: nothing, no fault */
    static const char *const near_unterminated[] = {"arrowarray", "Arrow_Array", "used_arrow_array", "a"};
    for (size_t i = 0; i < sizeof near_unterminated / sizeof near_unterminated[0]; i++) {
        size_t len = strlen(near_unterminated[i]);
        char *s = map + pg - len;
        memcpy(s, near_unterminated[i], len);
        CHECK(name_kind_new(s) == NK_NONE, "unterminated \"%s\" at the guard page", near_unterminated[i]);
    }
    /* no NUL before the guard page (the C API's contract broken): never
     * a DLPack name, and never a fault */
    static const char *const unterminated[] = {"dltensor", "dltensor_versioned", "used_dltensor",
                                               "used_dltensor_versioned", "numpy_dltensor", "d"};
    for (size_t i = 0; i < sizeof unterminated / sizeof unterminated[0]; i++) {
        size_t len = strlen(unterminated[i]);
        char *s = map + pg - len;
        memcpy(s, unterminated[i], len);
        CHECK(name_kind(s) == NK_NONE, "unterminated \"%s\" at the guard page", unterminated[i]);
    }
    char *mh = map + pg - sizeof "mem_handler";
    memcpy(mh, "mem_handler", sizeof "mem_handler");
    CHECK(eq(mh, "mem_handler"), "mem_handler at the page end");
    mh[3] = '-';
    CHECK(!eq(mh, "mem_handler"), "mem-handler is not mem_handler");
    munmap(map, (size_t)pg * 2);
    printf("test_names: %d passed, %d failed\n", checks - failures, failures);
    return failures != 0;
}
