/* Capsule names, classified on every PyCapsule call (capsule*.c).
 * Most capsule traffic is not DLPack's, so this must cost next to nothing
 * and must never fault on a name that ends at the edge of a mapping. */
#ifndef CAPSAN_NAMES_H
#define CAPSAN_NAMES_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "probe.h"

enum {
    NK_NONE = 0,
    NK_DL,        /* dltensor */
    NK_DLV,       /* dltensor_versioned */
    NK_USED,      /* used_dltensor */
    NK_USEDV,     /* used_dltensor_versioned */
    NK_NPDL,      /* numpy_dltensor(_versioned): numpy's owner capsule */
    NK_XAPI,      /* dlpack_exchange_api: DLPack 1.3's exchange table (xapi.h) */
    NK_AR_NEAR,   /* almost an Arrow name (R40; name_kind_new, PyCapsule_New's, only) */
    NK_AR_SCHEMA, /* the Arrow PyCapsule interface (arrow.h), in cs_ar_type order */
    NK_AR_ARRAY,
    NK_AR_STREAM,
    NK_AR_DEVICE_ARRAY,
    NK_AR_DEVICE_STREAM,
};
#define NK_IS_ARROW(k) ((k) >= NK_AR_SCHEMA)
#define NK_AR_TYPE(k) ((k) - NK_AR_SCHEMA + 1) /* cs_ar_type */

/* Names are compared on every capsule call, most of them not DLPack's.
 * A name is compared with a literal a word at a time when all the bytes
 * read lie in the page of its first byte (so no read can fault), else
 * a byte at a time (eq_crossing). */
static inline uint64_t ld8(const char *p)
{
    uint64_t v;
    memcpy(&v, p, 8);
    return v;
}

/* The bytes of s run into the next page: a byte at a time, and past the
 * page only when it can be read (a name with no NUL before an unmapped
 * page is no DLPack name, and must not fault capsan). */
static int eq_crossing(const char *s, const char *lit, size_t n)
{
    size_t in_page = 4096 - ((uintptr_t)s & 4095);
    for (size_t i = 0; i < n; i++) {
        if (i == in_page && !cs_probe_read(s + i, n - i))
            return 0;
        if (s[i] != lit[i])
            return 0;
    }
    return 1;
}

/* n = sizeof the literal, NUL included, at least 9: whole words, then an
 * overlapping last word. Constant-folds to a few compares. */
static inline int eqn(const char *s, const char *lit, size_t n)
{
    if (((uintptr_t)s & 4095) > 4096 - n)
        return eq_crossing(s, lit, n);
    size_t i = 0;
    for (; i + 8 <= n; i += 8)
        if (ld8(s + i) != ld8(lit + i))
            return 0;
    return i == n || ld8(s + n - 8) == ld8(lit + n - 8);
}
#define eq(s, lit) eqn(s, lit, sizeof lit)

/* Arrow's names, out of line: the DLPack names' path stays as it was */
__attribute__((noinline, unused)) static int arrow_name_kind(const char *n)
{
    if (eq(n, "arrow_schema"))
        return NK_AR_SCHEMA;
    if (eq(n, "arrow_array"))
        return NK_AR_ARRAY;
    if (eq(n, "arrow_array_stream"))
        return NK_AR_STREAM;
    if (eq(n, "arrow_device_array"))
        return NK_AR_DEVICE_ARRAY;
    if (eq(n, "arrow_device_array_stream"))
        return NK_AR_DEVICE_STREAM;
    return NK_NONE;
}

/* R40's near misses: a name a producer meant as an Arrow one and got
 * wrong, which consumers looking for the exact name will not find: the
 * early drafts' names (arrowschema, arrowarray: apache/arrow PR 37797),
 * '-' for '_', another case, or a used_ prefix (a DLPack habit: Arrow
 * capsules are never renamed). Case, '_', '-', '.' and ' ' are ignored
 * and a leading "used" taken off; what is left must be one of the five
 * names. The struct it resembles (1..5, cs_ar_type's order), with
 * AR_NEAR_USED for the prefix; 0 for any other name. Reached only by
 * names whose first byte is a, A or u that no exact compare took. */
#define AR_NEAR_USED 0x10
#define AR_NEAR_MAX 48 /* longer names are no near miss */
__attribute__((noinline, cold, unused)) static int arrow_near_miss(const char *n)
{
    static const char *const want[5] = {"arrowschema", "arrowarray", "arrowarraystream",
                                        "arrowdevicearray", "arrowdevicearraystream"};
    char c[AR_NEAR_MAX + 1];
    size_t k = 0, in_page = 4096 - ((uintptr_t)n & 4095), from = 0;
    for (size_t i = 0;; i++) {
        if (i == in_page && !cs_probe_read(n + i, 1))
            return 0; /* runs into an unreadable page: no name at all */
        char ch = n[i];
        if (!ch)
            break;
        if (i == AR_NEAR_MAX)
            return 0;
        if (ch == '_' || ch == '-' || ch == '.' || ch == ' ')
            continue;
        c[k++] = ch >= 'A' && ch <= 'Z' ? (char)(ch + 32) : ch;
        /* most names that start like one part ways within "arrow" (or
         * "usedarrow"): stop there */
        if (k == 4 && !memcmp(c, "used", 4))
            from = 4;
        else if (k > from && k - from <= 5 && c[k - 1] != "arrow"[k - from - 1] &&
                 !(k <= 4 && !from && c[k - 1] == "used"[k - 1]))
            return 0;
    }
    c[k] = 0;
    const char *s = c;
    int used = 0;
    if (!strncmp(s, "used", 4)) {
        s += 4;
        used = AR_NEAR_USED;
    }
    for (int t = 0; t < 5; t++)
        if (!strcmp(s, want[t]))
            return (t + 1) | used;
    return 0;
}

/* What a capsule name says: NK_NONE for every name DLPack and Arrow do not
 * use. near (a constant): PyCapsule_New's question, which also tells
 * R40's near misses (NK_AR_NEAR) apart; they share the first-byte switch,
 * so a name starting with any other byte pays nothing for them. */
static inline __attribute__((always_inline)) int name_kind_x(const char *n, int near)
{
    if (!n)
        return NK_NONE;
    switch (n[0]) {
    case 'd':
        if (eq(n, "dltensor"))
            return NK_DL;
        if (eq(n, "dltensor_versioned"))
            return NK_DLV;
        if (eq(n, "dlpack_exchange_api"))
            return NK_XAPI;
        return NK_NONE;
    case 'u':
        if (eq(n, "used_dltensor"))
            return NK_USED;
        if (eq(n, "used_dltensor_versioned"))
            return NK_USEDV;
        return near && arrow_near_miss(n) ? NK_AR_NEAR : NK_NONE;
    case 'n':
        if (eq(n, "numpy_dltensor") || eq(n, "numpy_dltensor_versioned"))
            return NK_NPDL;
        return NK_NONE;
    case 'A':
        return near && arrow_near_miss(n) ? NK_AR_NEAR : NK_NONE;
    }
    if (n[0] != 'a')
        return NK_NONE;
    int k = arrow_name_kind(n);
    return k == NK_NONE && near && arrow_near_miss(n) ? NK_AR_NEAR : k;
}

static inline int name_kind(const char *n) { return name_kind_x(n, 0); }
/* PyCapsule_New's: name_kind, and NK_AR_NEAR for R40's near misses */
static inline int name_kind_new(const char *n) { return name_kind_x(n, 1); }

#endif
