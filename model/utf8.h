/* UTF-8 validation for the escapers of json.c and html.c (header-only:
 * json.c is also linked into the runtime). */
#ifndef CAPSAN_UTF8_H
#define CAPSAN_UTF8_H

#include <stddef.h>

/* Length of the valid UTF-8 sequence at s (at most avail bytes), 0 if not:
 * no overlong forms, no UTF-16 surrogates, nothing above U+10FFFF. */
static inline size_t cs_utf8_len(const unsigned char *s, size_t avail)
{
    unsigned c = s[0];
    size_t need;
    unsigned lo = 0x80, hi = 0xBF; /* allowed range of the second byte */
    if (c < 0x80)
        return 1;
    if (c >= 0xC2 && c <= 0xDF) {
        need = 2;
    } else if (c >= 0xE0 && c <= 0xEF) {
        need = 3;
        if (c == 0xE0)
            lo = 0xA0;
        if (c == 0xED)
            hi = 0x9F;
    } else if (c >= 0xF0 && c <= 0xF4) {
        need = 4;
        if (c == 0xF0)
            lo = 0x90;
        if (c == 0xF4)
            hi = 0x8F;
    } else {
        return 0;
    }
    if (avail < need || s[1] < lo || s[1] > hi)
        return 0;
    for (size_t i = 2; i < need; i++)
        if ((s[i] & 0xC0) != 0x80)
            return 0;
    return need;
}

#endif
