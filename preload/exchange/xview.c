/* Non-owning exchange-API views (see xview.h).
 *
 * A view is valid while the C call that made it lasts: from the Python
 * code's point of view, while the frame that made the call still stands
 * at that call's instruction (cs_stack_py_within). Its key in the
 * lifecycle is a slot of capsan's, which tells dataguard.c a view's data
 * from a consumed tensor's by address alone. A thread's views that are no
 * longer valid end when it makes its next one: then, a view whose
 * DLTensor lies off the thread's stack and still describes its data is
 * kept (the caller stored it), and stays watched until its owner's data
 * is freed, the DLTensor is overwritten, or the block holding it freed.
 *
 * A slot is changed only by its own thread; another thread's free of a
 * view's data reads the view's thread's Python frames (it runs without
 * the GIL while its C call lasts, so they stand still) and flags the slot
 * for its thread to end. */
#include "xview.h"

#include <stdatomic.h>

#include "dataindex.h"
#include "freefilter.h"
#include "probe.h"
#include "pyapi.h"
#include "runtime.h"
#include "stack.h"
#include "thread.h"

#define NVIEWS 256
typedef struct xview {
    _Atomic uint32_t thread;  /* capsan's thread number; 0 = free */
    uint8_t kept;             /* its call returned; its DLTensor kept off the stack */
    uint8_t on_stack;         /* out lies on its thread's stack, or that is unknown */
    uint8_t watched;          /* out (off the stack) is watched: its block's free ends it */
    _Atomic uint8_t done;     /* ended for its thread to free: judged elsewhere */
    cs_py_pos pos;
    const void *ts;           /* its thread's PyThreadState */
    const void *out;          /* the DLTensor the producer filled */
    uint64_t data;            /* out->data as it was filled */
} xview;
static xview views[NVIEWS];

/* a view's DLTensor, watched by this key: inside the slot */
#define OUT_KEY(v) ((uint64_t)(uintptr_t)&(v)->out)

int cs_xview_is_view(uint64_t key)
{
    return key - (uint64_t)(uintptr_t)views < sizeof views;
}

static void watch_out(xview *v, int sign)
{
    uint64_t at = (uint64_t)(uintptr_t)v->out;
    if (sign > 0)
        cs_di_add(at, OUT_KEY(v));
    else
        cs_di_remove(at, OUT_KEY(v));
    uintptr_t g = (uintptr_t)(at >> CS_FF_GRAIN);
    cs_ff_count(g, sign);
    cs_ff_count(g - 1, sign);
}

/* the DLTensor still says what the view said (data is its first field) */
static int describes(const xview *v)
{
    return cs_probe_read(v->out, sizeof(uint64_t)) && *(const uint64_t *)v->out == v->data;
}

static void view_end(xview *v)
{
    cs_event ev = {.kind = CS_EV_DELETE, .obj = (uint64_t)(uintptr_t)v, .aux = CS_DELETE_VIEW_END};
    cs_emit(&ev, 0, NULL, NULL);
    if (v->watched)
        watch_out(v, -1);
    v->kept = v->watched = 0;
    atomic_store_explicit(&v->done, 0, memory_order_relaxed);
    atomic_store_explicit(&v->thread, 0, memory_order_release);
}

/* its call returned: kept, or ended */
static void view_returned(xview *v)
{
    if (v->on_stack || !describes(v)) {
        view_end(v);
        return;
    }
    v->kept = 1;
    cs_event ev = {.kind = CS_EV_DELETE, .obj = (uint64_t)(uintptr_t)v, .aux = CS_DELETE_VIEW_KEPT,
                   .a = (uint64_t)(uintptr_t)v->out};
    cs_emit(&ev, 1, NULL, NULL);
}

/* End or keep this thread's views whose calls returned; a free slot, or
 * NULL. A kept view whose DLTensor is now another (new_out: the one
 * being filled) ends. */
static xview *views_sweep(uint32_t me, int gil, const void *new_out)
{
    xview *free_slot = NULL;
    for (int i = 0; i < NVIEWS; i++) {
        xview *v = &views[i];
        uint32_t who = atomic_load_explicit(&v->thread, memory_order_acquire);
        if (who == me) {
            if (atomic_load_explicit(&v->done, memory_order_acquire) ||
                (v->kept && (v->out == new_out || !describes(v))))
                view_end(v), who = 0;
            else if (!v->kept && !cs_stack_py_within(gil, &v->pos))
                view_returned(v), who = atomic_load_explicit(&v->thread, memory_order_relaxed);
        }
        if (!who && !free_slot) {
            uint32_t zero = 0;
            if (atomic_compare_exchange_strong(&v->thread, &zero, me))
                free_slot = v;
        }
    }
    return free_slot;
}

void cs_xview_born(const void *out, uint64_t data, uint64_t nbytes, uint8_t flags, int gil)
{
    cs_thread *t = cs_thread_get();
    cs_py_pos pos;
    if (!t || !data || !cs_stack_py_pos(gil, &pos))
        return; /* no Python call to be valid within */
    xview *v = views_sweep(t->num, gil, out);
    if (!v)
        return; /* out of slots: this view is not watched */
    v->pos = pos;
    v->ts = cs_stack_py_tstate(gil);
    v->out = out;
    v->data = data;
    v->kept = v->watched = 0;
    cs_event ev = {.kind = CS_EV_EXPORT, .obj = (uint64_t)(uintptr_t)v, .a = data, .c = nbytes,
                   .aux = CS_DLV_XVIEW, .flags = (uint8_t)(flags | CS_EVF_NULL_DELETER)};
    cs_emit(&ev, 1, NULL, NULL);
    /* after the capture: this thread's stack bounds are known then */
    v->on_stack = cs_stack_holds(t, out) != 0;
    if (!v->on_stack) {
        watch_out(v, 1); /* kept, maybe: a free of its block ends it */
        v->watched = 1;
    }
}

static void data_freed(xview *v, uintptr_t p, unsigned how)
{
    cs_event ev = {.kind = CS_EV_DATA_FREED, .obj = (uint64_t)(uintptr_t)v, .a = p,
                   .aux = (uint16_t)how};
    cs_emit(&ev, 1, NULL, NULL); /* reported before the memory is reused */
}

void cs_xview_freed(uint64_t key, uintptr_t p, unsigned how)
{
    xview *v = &views[(key - (uint64_t)(uintptr_t)views) / sizeof(xview)];
    cs_thread *t = cs_thread_tls;
    uint32_t who = atomic_load_explicit(&v->thread, memory_order_acquire);
    if (!who || atomic_load_explicit(&v->done, memory_order_acquire))
        return;
    int mine = t && who == t->num;
    if (key == OUT_KEY(v)) {
        /* the block holding the view's DLTensor: the view is gone (kept
         * or not, nothing can read it as the producer filled it) */
        if (mine)
            view_end(v);
        else
            atomic_store_explicit(&v->done, 1, memory_order_release);
        return;
    }
    if (!mine) {
        /* another thread's view: judged while its call lasts (its frames
         * stand still: it runs without the GIL), or once kept */
        if (v->kept ? describes(v)
                    : cs_stack_py_within_ts(v->ts, &v->pos)) {
            data_freed(v, p, how);
            if (v->kept)
                atomic_store_explicit(&v->done, 1, memory_order_release);
        }
        return;
    }
    if (!v->kept) {
        int gil = cs_py_live() && cs_gil_held();
        if (cs_stack_py_within(gil, &v->pos)) {
            data_freed(v, p, how);
            return;
        }
        view_returned(v);
        if (!v->kept)
            return;
    } else if (!describes(v)) {
        view_end(v);
        return;
    }
    data_freed(v, p, how);
    view_end(v);
}
