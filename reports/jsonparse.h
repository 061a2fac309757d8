/* A small JSON reader (RFC 8259) for the report tool's saved reports
 * (savedreport.h): the whole text into a tree of values. Untrusted input:
 * nesting is limited, strings are decoded to UTF-8 (an unpaired surrogate
 * becomes U+FFFD) and a syntax error names its offset. */
#ifndef CAPSAN_JSONPARSE_H
#define CAPSAN_JSONPARSE_H

#include <stddef.h>
#include <stdint.h>

enum { CS_JV_NULL, CS_JV_BOOL, CS_JV_NUM, CS_JV_STR, CS_JV_ARR, CS_JV_OBJ };

typedef struct cs_jv {
    int type;
    int boolean;
    double num;
    int is_uint;              /* a plain non-negative integer that fits: u holds it */
    uint64_t u;
    char *str;                /* NUL-terminated (a \u0000 ends it early) */
    struct cs_jv *items;      /* array elements, object values */
    char **keys;              /* object keys, one per item */
    size_t n;
} cs_jv;

/* Parses text[0, len) (one value, surrounded by whitespace only). NULL on
 * error, with a message in err. Free with cs_jv_free. */
cs_jv *cs_jv_parse(const char *text, size_t len, char *err, size_t errlen);
void cs_jv_free(cs_jv *v);

/* Lookups that tolerate the wrong type: NULL, "" or the default. */
const cs_jv *cs_jv_get(const cs_jv *obj, const char *key);
const char *cs_jv_str(const cs_jv *obj, const char *key);          /* "" if absent */
uint64_t cs_jv_uint(const cs_jv *obj, const char *key, uint64_t dflt);
/* "0x1f" strings (the reports' addresses) and plain numbers */
uint64_t cs_jv_hex(const cs_jv *obj, const char *key);
int cs_jv_bool(const cs_jv *obj, const char *key);

#endif
