/* Capsule names, classified on every PyCapsule call (capsule.c).
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

/* What a capsule name says: NK_NONE for every name DLPack and Arrow do not use. */
static inline int name_kind(const char *n)
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
        return NK_NONE;
    case 'n':
        if (eq(n, "numpy_dltensor") || eq(n, "numpy_dltensor_versioned"))
            return NK_NPDL;
        return NK_NONE;
    }
    return n[0] == 'a' ? arrow_name_kind(n) : NK_NONE;
}

#endif
