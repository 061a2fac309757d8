/* The per-version table (pyversions.inc) as structs. */
#include "pyversion.h"

#include <stddef.h>

static const cs_pylayout layouts[] = {
#define PYV(minor, model, ...) {minor, model, __VA_ARGS__},
#include "pyversions.inc"
#undef PYV
};

const cs_pylayout *cs_pylayout_for(int major, int minor)
{
    if (major != 3)
        return NULL;
    for (size_t i = 0; i < sizeof layouts / sizeof layouts[0]; i++)
        if (layouts[i].minor == minor)
            return &layouts[i];
    return NULL;
}
