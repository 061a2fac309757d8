/* Arrow findings and events in words (see arrowtext.h). */
#include "arrowtext.h"

#include <stdio.h>
#include <string.h>

static const char *type_name(unsigned type)
{
    switch (type) {
    case CS_AR_SCHEMA: return "ArrowSchema";
    case CS_AR_ARRAY: return "ArrowArray";
    case CS_AR_STREAM: return "ArrowArrayStream";
    case CS_AR_DEVICE_ARRAY: return "ArrowDeviceArray";
    case CS_AR_DEVICE_STREAM: return "ArrowDeviceArrayStream";
    }
    return "Arrow struct";
}

static const char *call_name(unsigned c)
{
    switch (c & 0xff) {
    case CS_ARC_GET_SCHEMA: return "get_schema";
    case CS_ARC_GET_NEXT: return "get_next";
    case CS_ARC_GET_LAST_ERROR: return "get_last_error";
    case CS_ARC_RELEASE: return "release";
    }
    return "a callback";
}

const char *cs_ar_event_name(const cs_event *ev)
{
    switch (ev->kind) {
    case CS_EV_AR_EXPORT:
        return (ev->aux & CS_AR_FROM_NEXT)     ? "get-next"
               : (ev->aux & CS_AR_FROM_SCHEMA) ? "get-schema"
               : (ev->aux & CS_AR_BY_ADDR)     ? "export-by-address"
               : (ev->aux & CS_AR_MOVED_KID)   ? "move-child"
                                               : "export";
    case CS_EV_AR_BORROW:
        return (ev->aux & CS_ARB_IMPORT)     ? "import-by-address"
               : (ev->aux & CS_ARB_RELEASED) ? "reconsume"
                                             : "borrow";
    case CS_EV_AR_RELEASE: return "release";
    case CS_EV_AR_CALL:
        return (ev->aux & 0xff) == CS_ARC_GET_NEXT     ? "get-next"
               : (ev->aux & 0xff) == CS_ARC_GET_SCHEMA ? "get-schema"
               : (ev->aux & 0xff) == CS_ARC_RELEASE    ? "release"
                                                       : "get-last-error";
    case CS_EV_AR_DESTROY: return ev->aux == CS_ARD_MOVED ? "move" : "destroy";
    case CS_EV_AR_CHECK:
        return ev->aux == CS_ARK_RENAMED ? "rename" : ev->aux == CS_ARK_BAD_NAME ? "export" : "check";
    case CS_EV_AR_REACHABLE: return "reachable";
    }
    return "event";
}

const char *cs_ar_event_phrase(const cs_finding *f, int i)
{
    const cs_event *ev = &f->events[i];
    int earlier = 0;
    for (int k = 0; k < i; k++)
        if (f->events[k].kind == ev->kind)
            earlier++;
    switch (ev->kind) {
    case CS_EV_AR_EXPORT:
        return (ev->aux & CS_AR_FROM_NEXT)     ? "returned by the stream's get_next at"
               : (ev->aux & CS_AR_FROM_SCHEMA) ? "returned by the stream's get_schema at"
               : (ev->aux & CS_AR_FOUND)
                   ? "first met at an import by address (born in the library of its release "
                     "callback), at"
               : (ev->aux & CS_AR_BY_ADDR) ? "exported by address at"
               : (ev->aux & CS_AR_MOVED_KID) && (ev->aux & CS_AR_MOVED_EARLY)
                   ? "moved out of its parent by its consumer (seen as the parent's capsule "
                     "died, the consumer at work) at"
               : (ev->aux & CS_AR_MOVED_KID)
                   ? "moved out of its parent by its consumer (seen as the parent's release "
                     "started) at"
                   : "exported in a capsule at";
    case CS_EV_AR_BORROW:
        if (ev->aux & CS_ARB_IMPORT)
            return "imported by address (moved into the importer, which releases it) at";
        if (ev->aux & CS_ARB_RELEASED)
            return "read again, already released (release == NULL), at";
        return earlier ? "read by another consumer at" : "read by a consumer at";
    case CS_EV_AR_RELEASE:
        if (ev->aux & CS_ARR_CHILD) {
            if (ev->aux & CS_ARR_AGAIN)
                return (ev->flags & CS_EVF_SKIPPED)
                           ? "a child's release called again, skipped (protect=1), at"
                           : "a child's release called again at";
            return (ev->aux & CS_ARR_KIDS_LEFT) ? "a child released, leaving its own children, at"
                                                : "a child released at";
        }
        if (ev->aux & CS_ARR_KIDS_LEFT)
            return "released, leaving a child or its dictionary unreleased, at";
        if (ev->flags & CS_EVF_SKIPPED)
            return "release called again, skipped (protect=1), at";
        if (ev->aux & CS_ARR_AGAIN)
            return (ev->aux & CS_ARR_MOVED) ? "released again, through another copy of the struct, at"
                                            : "released again at";
        if (ev->aux & CS_ARR_IN_DTOR)
            return "released by its capsule's destructor at";
        return (ev->aux & CS_ARR_MOVED) ? "released (the moved copy) at" : "released at";
    case CS_EV_AR_CALL:
        if (ev->aux & CS_ARC_RELEASED)
            return "stream callback called after its release at";
        return (ev->aux & 0xff) == CS_ARC_RELEASE
                   ? "released while another thread was inside a stream callback at"
                   : "stream callback called concurrently at";
    case CS_EV_AR_DESTROY:
        return ev->aux == CS_ARD_MOVED ? "moved out by its consumer (the capsule died with "
                                         "release == NULL) at"
                                       : "capsule destroyed at";
    case CS_EV_AR_CHECK:
        return ev->aux == CS_ARK_RENAMED           ? "capsule renamed at"
               : ev->aux == CS_ARK_BAD_NAME        ? "capsule made under that name at"
               : ev->aux == CS_ARK_IMPORT_RELEASED ? "imported by address, already released, at"
                                                   : "checked at";
    case CS_EV_AR_REACHABLE:
        return ev->aux == CS_WHERE_THREAD
                 ? "held at the end by a Python thread still running (a daemon thread), which moved it last"
               : ev->aux == CS_WHERE_THREAD_FRAMES
                 ? "held at the end by a Python thread still running (a daemon thread), whose frames reach its capsule"
               : ev->aux == CS_WHERE_MODULE_KEPT || ev->aux == CS_WHERE_PY_REACHED
                 ? "held at the end: its capsule was still referenced by Python objects a module's globals "
                   "reached at atexit (pytest's parameters, a library's cache)"
                 : "still referenced at the end: a copy of the struct is stored in the process's memory";
    }
    return "at";
}

const char *cs_ar_object_type(const cs_finding *f)
{
    if (f->kind == CS_KIND_ARROW_BAD_NAME)
        return "PyCapsule";
    for (int i = 0; i < f->nevents; i++) {
        if (f->events[i].kind == CS_EV_AR_EXPORT)
            return type_name(CS_AR_TYPE(f->events[i].aux));
        if (f->events[i].kind == CS_EV_AR_CHECK && f->events[i].aux == CS_ARK_IMPORT_RELEASED)
            return type_name(f->events[i].extra);
    }
    return "Arrow struct";
}

/* where the struct came from: its capsule, or a stream callback */
static const char *origin_words(const cs_finding *f)
{
    for (int i = 0; i < f->nevents; i++)
        if (f->events[i].kind == CS_EV_AR_EXPORT)
            return (f->events[i].aux & CS_AR_FROM_NEXT)     ? "returned by get_next"
                   : (f->events[i].aux & CS_AR_FROM_SCHEMA) ? "returned by get_schema"
                   : (f->events[i].aux & CS_AR_FOUND)       ? "handed over by address"
                   : (f->events[i].aux & CS_AR_BY_ADDR)     ? "exported by address"
                   : (f->events[i].aux & CS_AR_MOVED_KID)   ? "a child moved out of its parent"
                                                            : "exported in a capsule";
    return "exported";
}

/* the name a BAD_NAME check carries in a, b, c (24 bytes, NUL-padded) */
static void bad_name(const cs_finding *f, char *out, size_t n)
{
    out[0] = 0;
    for (int i = 0; i < f->nevents; i++) {
        const cs_event *ev = &f->events[i];
        if (ev->kind != CS_EV_AR_CHECK || ev->aux != CS_ARK_BAD_NAME)
            continue;
        char raw[25];
        uint64_t w[3] = {ev->a, ev->b, ev->c};
        memcpy(raw, w, 24);
        raw[24] = 0;
        size_t k = 0;
        for (size_t j = 0; raw[j] && k + 5 < n; j++) /* unprintable bytes as \xNN */
            k += (unsigned char)raw[j] >= 0x20 && (unsigned char)raw[j] < 0x7f
                     ? (size_t)snprintf(out + k, n - k, "%c", raw[j])
                     : (size_t)snprintf(out + k, n - k, "\\x%02x", (unsigned char)raw[j]);
        if (strlen(raw) == 24 && k + 4 < n)
            snprintf(out + k, n - k, "...");
        return;
    }
}

static const char *const exact_names[6] = {"", "arrow_schema", "arrow_array", "arrow_array_stream",
                                           "arrow_device_array", "arrow_device_array_stream"};

const char *cs_ar_message(const cs_finding *f, char *buf, size_t n)
{
    const char *t = cs_ar_object_type(f);
    unsigned long long p = (unsigned long long)f->obj;
    switch (f->kind) {
    case CS_KIND_ARROW_LEAK:
        switch (f->detail) {
        case CS_LEAK_CONSUMED: {
            int by_addr = 0, imported = 0;
            for (int i = 0; i < f->nevents; i++) {
                by_addr |= f->events[i].kind == CS_EV_AR_EXPORT &&
                           (f->events[i].aux & CS_AR_BY_ADDR);
                imported |= f->events[i].kind == CS_EV_AR_BORROW &&
                            (f->events[i].aux & CS_ARB_IMPORT);
            }
            if (imported)
                snprintf(buf, n, "%s %#llx (%s) was imported by address and never released "
                         "(R42, R49: the importer owns the release)", t, p, origin_words(f));
            else if (by_addr)
                snprintf(buf, n, "%s %#llx (%s) was never imported or released (R42, R49: "
                         "whoever holds a struct exported by address must import it or call "
                         "its release)", t, p, origin_words(f));
            else
                snprintf(buf, n, "%s %#llx (%s) was moved out by its consumer and never "
                         "released (R42: the consumer must call release when done)", t, p,
                         origin_words(f));
            break;
        }
        case CS_LEAK_NULL_DESTRUCTOR:
            snprintf(buf, n, "%s %#llx leaked: its capsule was created without a destructor and "
                     "died with release still set (R41)", t, p);
            break;
        case CS_LEAK_NEVER_CONSUMED:
            snprintf(buf, n, "%s %#llx (%s) was never released: its capsule was still alive at "
                     "exit", t, p, origin_words(f));
            break;
        case CS_LEAK_CHILD: {
            char which[48];
            if ((uint32_t)f->value == 0xffffffffu)
                snprintf(which, sizeof which, "its dictionary");
            else
                snprintf(which, sizeof which, "child %llu", (unsigned long long)(uint32_t)f->value);
            snprintf(buf, n, "%s of %s %#llx (%s) was never released: the producer's release "
                     "returned without releasing it (R44: release must release every child and "
                     "the dictionary not moved out)", which, t, p, origin_words(f));
            break;
        }
        case CS_LEAK_KILLED:
            snprintf(buf, n, "%s %#llx was not released when the process was killed (no leak "
                     "verdict)", t, p);
            break;
        default:
            snprintf(buf, n, "%s %#llx leaked: its capsule died with release still set and its "
                     "destructor did not call release (R41)", t, p);
        }
        break;
    case CS_KIND_ARROW_DOUBLE_RELEASE:
        snprintf(buf, n, "release of %s%s %#llx called a second time (R42): a consumer kept a "
                 "copy that was not a move, or released the source after moving it; the "
                 "producer's release now frees its private data again",
                 f->detail == CS_ARR_CHILD ? "a child of " : "", t, p);
        break;
    case CS_KIND_ARROW_RELEASE_NOT_CLEARED:
        snprintf(buf, n, "the producer's release of %s%s %#llx returned without setting release "
                 "= NULL (R44): a consumer that checks release before releasing will release it "
                 "twice (arrow-nanoarrow #203)", f->detail == CS_ARR_CHILD ? "a child of " : "", t, p);
        break;
    case CS_KIND_ARROW_RECONSUME: {
        int released = 0;
        for (int i = 0; i < f->nevents; i++)
            released |= f->events[i].kind == CS_EV_AR_RELEASE;
        /* the advice is about the second hand-over, which capsan saw; what
         * the consumer then did with the empty struct it cannot see here (a
         * call through it is an arrow-use-after-release of its own) */
        snprintf(buf, n, "%s %#llx consumed again after it was %s (R43): a capsule can be "
                 "consumed once, and this one was handed to a consumer again; give each "
                 "consumer a capsule of its own (call __arrow_c_*__ again). A consumer that "
                 "checks release != NULL refuses it (duckdb raises \"already released\"); one "
                 "that does not reads an empty struct (polars) or panics (arro3)",
                 t, p, released ? "released" : "moved out");
        break;
    }
    case CS_KIND_ARROW_USE_AFTER_RELEASE:
        /* value: called through the very struct its release ran on (its
         * holder released it and read it anyway); else through a copy of
         * it, kept from before its release or a move */
        snprintf(buf, n, "%s of %s %#llx called after the stream was released (R45): its "
                 "private data is gone (%s)", call_name(f->detail), t, p,
                 f->value ? "its holder released this struct and then called through it, as a "
                            "reader closed and read again (apache/arrow #34906)"
                          : "a stale copy of a released stream, arrow-adbc #4363");
        break;
    case CS_KIND_ARROW_STREAM_MISUSE:
        snprintf(buf, n, "%s of %s %#llx called while thread %llu was inside a callback of the "
                 "same stream (R45): stream callbacks are not thread-safe and must be "
                 "serialized%s", call_name(f->detail), t, p, (unsigned long long)f->value,
                 f->detail == CS_ARC_RELEASE ? "; that callback now runs on a released stream"
                                             : "");
        break;
    case CS_KIND_ARROW_RENAMED:
        snprintf(buf, n, "the capsule of %s %#llx was renamed (R40): Arrow capsules keep their "
                 "name; the producer's destructor no longer finds its struct and leaks it", t, p);
        break;
    case CS_KIND_ARROW_BAD_STRUCT:
        switch (f->detail) {
        case CS_ARK_RELEASED:
            snprintf(buf, n, "%s %#llx was already released (release == NULL) when its first "
                     "consumer read the capsule (R43): its producer handed out an empty or "
                     "consumed struct", t, p);
            break;
        case CS_ARK_NULL_CALLBACK:
            snprintf(buf, n, "%s %#llx has a NULL %s (R45)", t, p, call_name((unsigned)f->value));
            break;
        case CS_ARK_IMPORT_RELEASED:
            snprintf(buf, n, "%s %#llx was imported by address with release == NULL (R43, R49): "
                     "its producer handed over an empty or released struct; the importer "
                     "refuses it, or reads garbage if it does not check", t, p);
            break;
        case CS_ARK_DEVICE:
            snprintf(buf, n, "%s %#llx: device_type %llu is not an ArrowDeviceType, or CPU "
                     "memory (1) comes with a sync_event (R48)", t, p, (unsigned long long)f->value);
            break;
        default:
            snprintf(buf, n, "%s %#llx is malformed", t, p);
        }
        break;
    case CS_KIND_ARROW_BAD_NAME: {
        char name[128];
        bad_name(f, name, sizeof name);
        unsigned ty = f->detail & 15u;
        const char *want = ty >= 1 && ty <= 5 ? exact_names[ty] : "arrow_*";
        if (f->detail & CS_ARK_NAME_USED)
            snprintf(buf, n, "capsule %#llx made under the name '%s' (R40): Arrow capsules are "
                     "named exactly '%s' and never renamed used_* (a DLPack habit); consumers "
                     "looking for '%s' will not find the struct", p, name, want, want);
        else
            snprintf(buf, n, "capsule %#llx made under the name '%s', a near miss of '%s' (R40): "
                     "consumers look for the exact name and will not find the struct", p, name,
                     want);
        break;
    }
    default:
        snprintf(buf, n, "%s %#llx", cs_kind_name(f->kind), p);
    }
    return buf;
}
