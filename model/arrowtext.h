/* The words reports use for the Arrow PyCapsule interface's findings and
 * events (arrowtext.c; findtext.c hands Arrow kinds and events here). */
#ifndef CAPSAN_ARROWTEXT_H
#define CAPSAN_ARROWTEXT_H

#include <stddef.h>
#include "lifecycle.h"

#define CS_KIND_IS_ARROW(k) ((k) >= CS_KIND_ARROW_LEAK && (k) <= CS_KIND_ARROW_BAD_NAME)

const char *cs_ar_event_name(const cs_event *ev);   /* "export", "borrow", "move", ... */
const char *cs_ar_event_phrase(const cs_finding *f, int i);
const char *cs_ar_object_type(const cs_finding *f); /* "ArrowArrayStream", ... */
const char *cs_ar_message(const cs_finding *f, char *buf, size_t n);

#endif
