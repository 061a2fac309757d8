/* Unit tests of model/lifecycle.c: event sequences in, findings out.
 * The same module judges live in the runtime and offline in the reader,
 * so these sequences pin down both. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"

#include "lifecycle.h"

static cs_finding got[64];
static int ngot;
static cs_event sunk[64];
static int nsunk;

static void on_finding(void *ud, const cs_finding *f)
{
    (void)ud;
    if (ngot < 64)
        got[ngot++] = *f;
}

static void on_sink(void *ud, const cs_event *ev)
{
    (void)ud;
    if (nsunk < 64)
        sunk[nsunk++] = *ev;
}


static cs_lifecycle *fresh(int protect)
{
    ngot = nsunk = 0;
    cs_lifecycle *lc = cs_lc_create(on_finding, NULL, 0);
    cs_lc_set_protect(lc, protect);
    cs_lc_set_sink(lc, on_sink, NULL);
    return lc;
}

static unsigned ev(cs_lifecycle *lc, int kind, uint64_t obj, uint64_t a, uint8_t flags)
{
    static uint64_t t;
    cs_event e = {.kind = (uint8_t)kind, .obj = obj, .a = a, .flags = flags, .time_ns = ++t,
                  .b = 0x1234, .c = 64};
    return cs_lc_event(lc, &e);
}

enum { MT = 0x1000, CAP = 0x2000, CAP2 = 0x3000 };

static void test_clean_exchange(void)
{
    cs_lifecycle *lc = fresh(0);
    ev(lc, CS_EV_EXPORT, MT, CAP, 0);
    ev(lc, CS_EV_CONSUME, MT, CAP, 0);
    ev(lc, CS_EV_DESTROY, MT, CAP, 0);
    ev(lc, CS_EV_DELETE, MT, 0, 0);
    cs_lc_finish(lc, CS_END_EXIT);
    CHECK(ngot == 0, "a clean exchange reported %d finding(s)", ngot);
    CHECK(nsunk == 0, "a clean object's events reached the trace (%d)", nsunk);
    cs_lc_destroy(lc);
}

static void test_double_delete(void)
{
    cs_lifecycle *lc = fresh(0);
    ev(lc, CS_EV_EXPORT, MT, CAP, 0);
    ev(lc, CS_EV_CONSUME, MT, CAP, 0);
    CHECK(ev(lc, CS_EV_DELETE, MT, 0, 0) == 0, "first delete must run");
    unsigned v = ev(lc, CS_EV_DELETE, MT, 0, 0);
    CHECK(v & CS_VERDICT_SKIP, "second delete must be skippable");
    CHECK(ngot == 1 && got[0].kind == CS_KIND_DLPACK_DOUBLE_DELETE, "kind %d", ngot ? got[0].kind : -1);
    CHECK(got[0].nevents == 4, "history export, consume, delete, delete: %d", got[0].nevents);
    /* write-behind: the whole history reached the sink, once, in order */
    CHECK(nsunk == 4 && sunk[0].kind == CS_EV_EXPORT && sunk[3].kind == CS_EV_DELETE,
          "sunk %d events", nsunk);
    cs_lc_destroy(lc);
}

static void test_not_renamed_then_destructor(void)
{
    cs_lifecycle *lc = fresh(1);
    ev(lc, CS_EV_EXPORT, MT, CAP, 0);
    ev(lc, CS_EV_DELETE, MT, 0, 0); /* consumer deletes, capsule still "dltensor" */
    unsigned v = ev(lc, CS_EV_DELETE, MT, CAP, CS_EVF_IN_DTOR); /* producer's destructor */
    CHECK(v & CS_VERDICT_SKIP, "the predicted second delete is skippable");
    CHECK(ngot == 1 && got[0].kind == CS_KIND_DLPACK_NOT_RENAMED,
          "one dlpack-not-renamed, got %d (first kind %d)", ngot, ngot ? got[0].kind : -1);
    cs_lc_destroy(lc);
}

static unsigned ev_x(cs_lifecycle *lc, int kind, uint64_t obj, uint64_t a, uint8_t flags,
                     uint32_t extra)
{
    static uint64_t t = 1000;
    cs_event e = {.kind = (uint8_t)kind, .obj = obj, .a = a, .flags = flags, .time_ns = ++t,
                  .b = 0x1234, .c = 64, .extra = extra};
    return cs_lc_event(lc, &e);
}

/* JAX copies unaligned data, releases the tensor, then renames the capsule
 * (and clears its destructor): late, but the name protects it */
static void test_delete_then_rename_is_clean(void)
{
    cs_lifecycle *lc = fresh(0);
    ev(lc, CS_EV_EXPORT, MT, CAP, 0);
    unsigned v = ev(lc, CS_EV_DELETE, MT, 0, 0);
    CHECK(v & CS_VERDICT_UNRENAMED, "a delete under an unconsumed name is flagged to the runtime");
    ev(lc, CS_EV_CONSUME, MT, CAP, 0);
    cs_lc_finish(lc, CS_END_EXIT);
    CHECK(ngot == 0, "delete then rename reported %d finding(s), first kind %d", ngot,
          ngot ? got[0].kind : -1);
    cs_lc_destroy(lc);
}

/* the consumer released and never renamed; the capsule died with no
 * destructor to delete again, at exit still alive, or read again */
static void test_not_renamed_confirmed_later(void)
{
    cs_lifecycle *lc = fresh(0);
    ev(lc, CS_EV_EXPORT, MT, CAP, 0);
    ev(lc, CS_EV_DELETE, MT, 0, 0);
    CHECK(ngot == 0, "not judged at the delete yet");
    ev_x(lc, CS_EV_DESTROY, MT, CAP, 0, CS_DESTROY_NO_DTOR);
    CHECK(ngot == 1 && got[0].kind == CS_KIND_DLPACK_NOT_RENAMED && got[0].nevents == 3,
          "dlpack-not-renamed at the capsule's death: %d, kind %d", ngot, ngot ? got[0].kind : -1);
    cs_lc_destroy(lc);

    lc = fresh(0);
    ev(lc, CS_EV_EXPORT, MT, CAP, 0);
    ev(lc, CS_EV_DELETE, MT, 0, 0);
    cs_lc_finish(lc, CS_END_EXIT);
    CHECK(ngot == 1 && got[0].kind == CS_KIND_DLPACK_NOT_RENAMED,
          "dlpack-not-renamed at exit for a capsule still alive: %d", ngot);
    cs_lc_destroy(lc);

    lc = fresh(0);
    ev(lc, CS_EV_EXPORT, MT, CAP, 0);
    ev(lc, CS_EV_DELETE, MT, 0, 0);
    ev(lc, CS_EV_GETPTR, MT, CAP, 0);
    CHECK(ngot == 1 && got[0].kind == CS_KIND_DLPACK_NOT_RENAMED,
          "dlpack-not-renamed at the read through the capsule: %d", ngot);
    unsigned v = ev(lc, CS_EV_DELETE, MT, CAP, CS_EVF_IN_DTOR);
    CHECK(ngot == 2 && got[1].kind == CS_KIND_DLPACK_DOUBLE_DELETE &&
              got[1].detail == CS_KIND_DLPACK_NOT_RENAMED && (v & CS_VERDICT_SKIP),
          "then the destructor's delete: a double delete caused by it, skippable: %d", ngot);
    cs_lc_destroy(lc);
}

/* a destructor that took the pointer by the unconsumed name and released
 * it without the deleter field (JAX's) released it; one that did not take
 * it leaked it */
static void test_destructor_took_the_tensor(void)
{
    cs_lifecycle *lc = fresh(0);
    ev(lc, CS_EV_EXPORT, MT, CAP, 0);
    ev_x(lc, CS_EV_DESTROY, MT, CAP, 0, CS_DESTROY_TOOK);
    cs_lc_finish(lc, CS_END_EXIT);
    CHECK(ngot == 0, "a destructor that took the tensor: %d finding(s)", ngot);
    CHECK(cs_lc_live(lc) == 0, "%zu live", cs_lc_live(lc));
    cs_lc_destroy(lc);
    lc = fresh(0);
    ev(lc, CS_EV_EXPORT, MT, CAP, 0);
    ev_x(lc, CS_EV_DESTROY, MT, CAP, 0, 0);
    CHECK(ngot == 1 && got[0].kind == CS_KIND_DLPACK_LEAK && got[0].detail == CS_LEAK_DESTROYED,
          "an empty destructor leaks: %d", ngot);
    cs_lc_destroy(lc);
}

static void test_unchecked_destructor(void)
{
    for (int protect = 0; protect <= 1; protect++) {
        cs_lifecycle *lc = fresh(protect);
        ev(lc, CS_EV_EXPORT, MT, CAP, 0);
        ev(lc, CS_EV_CONSUME, MT, CAP, 0);
        ev(lc, CS_EV_DELETE, MT, CAP, CS_EVF_IN_DTOR); /* destructor ignored the name */
        ev(lc, CS_EV_DELETE, MT, 0, 0);                /* the consumer's own release */
        cs_lc_finish(lc, CS_END_EXIT);
        CHECK(ngot == 2 - protect && got[0].kind == CS_KIND_DLPACK_UNCHECKED_DESTRUCTOR,
              "protect=%d: %d finding(s), first kind %d", protect, ngot, ngot ? got[0].kind : -1);
        /* unprotected, the destructor's release ran: the consumer's is the
         * double delete the first finding caused */
        CHECK(protect || (got[1].kind == CS_KIND_DLPACK_DOUBLE_DELETE &&
                          got[1].detail == CS_KIND_DLPACK_UNCHECKED_DESTRUCTOR &&
                          got[1].nevents == 4),
              "protect=0: a double delete naming its cause, with both deletes");
        cs_lc_destroy(lc);
    }
}

/* A consumed tensor's capsule died; another capsule made at the same
 * address (memory reused) has a destructor that releases the tensor (a
 * torch tensor dying inside numpy's internal capsule's destructor): the
 * consumer's release, not the producer's destructor ignoring the name. */
static void test_destructor_of_a_capsule_at_a_dead_ones_address(void)
{
    cs_lifecycle *lc = fresh(0);
    ev(lc, CS_EV_EXPORT, MT, CAP, 0);
    ev(lc, CS_EV_CONSUME, MT, CAP, 0);
    ev(lc, CS_EV_DESTROY, MT, CAP, 0);               /* renamed: nothing released */
    ev(lc, CS_EV_DELETE, MT, CAP, CS_EVF_IN_DTOR);   /* another capsule there now */
    cs_lc_finish(lc, CS_END_EXIT);
    CHECK(ngot == 0, "a release inside another capsule's destructor: %d finding(s), first kind %d",
          ngot, ngot ? got[0].kind : -1);
    cs_lc_destroy(lc);
}

static void test_leaks(void)
{
    cs_lifecycle *lc = fresh(0);
    ev(lc, CS_EV_EXPORT, MT, CAP, 0);
    ev(lc, CS_EV_CONSUME, MT, CAP, 0); /* never deleted */
    ev(lc, CS_EV_EXPORT, MT + 64, CAP2, 0);
    ev(lc, CS_EV_DESTROY, MT + 64, CAP2, 0); /* died unconsumed, not released */
    CHECK(ngot == 1 && got[0].kind == CS_KIND_DLPACK_LEAK && got[0].detail == CS_LEAK_DESTROYED,
          "destroyed-unreleased leak at destroy time");
    cs_lc_finish(lc, CS_END_SIGNAL);
    CHECK(ngot == 1, "no leak judgement for a killed process");
    cs_lc_finish(lc, CS_END_EXIT);
    CHECK(ngot == 2 && got[1].detail == CS_LEAK_CONSUMED && got[1].bytes == 64,
          "consumed-never-deleted leak at exit");
    cs_lc_destroy(lc);
}

static void test_null_deleter_never_leaks(void)
{
    /* legal, never a leak, and each export of the same static struct is
     * a new loan (no reconsume) */
    cs_lifecycle *lc = fresh(0);
    for (int i = 0; i < 3; i++) {
        ev(lc, CS_EV_EXPORT, MT, CAP + (uint64_t)i * 64, CS_EVF_NULL_DELETER);
        ev(lc, CS_EV_CONSUME, MT, CAP + (uint64_t)i * 64, 0);
    }
    cs_lc_finish(lc, CS_END_EXIT);
    CHECK(ngot == 0, "a NULL deleter lent three times: %d finding(s)", ngot);
    cs_lc_totals t;
    cs_lc_totals_get(lc, &t);
    CHECK(t.dlpack == 1, "one live struct, not three: %lld", (long long)t.dlpack);
    cs_lc_destroy(lc);
    /* the consumer that calls it (the crash handler's event) errs */
    lc = fresh(0);
    ev(lc, CS_EV_EXPORT, MT, CAP, CS_EVF_NULL_DELETER);
    ev(lc, CS_EV_CONSUME, MT, CAP, 0);
    cs_event call = {.kind = CS_EV_DELETE, .obj = MT, .aux = CS_DELETE_NULL_CALL, .time_ns = 99};
    cs_lc_event(lc, &call);
    CHECK(ngot == 1 && got[0].kind == CS_KIND_DLPACK_NULL_DELETER && got[0].nevents == 3,
          "a call through the NULL deleter: %d", ngot);
    CHECK(cs_kind_severity(got[0].kind) == CS_SEV_ERROR, "an error");
    cs_lc_destroy(lc);
}

static void test_reconsume(void)
{
    /* the owner reading its consumed capsule while it holds the tensor */
    cs_lifecycle *lc = fresh(0);
    ev(lc, CS_EV_EXPORT, MT, CAP, 0);
    ev(lc, CS_EV_CONSUME, MT, CAP, 0);
    ev(lc, CS_EV_GETPTR_USED, MT, CAP, 0);
    CHECK(ngot == 0, "the owner's own read is not a reconsume: %d", ngot);
    /* taken again after its release */
    ev(lc, CS_EV_DELETE, MT, 0, 0);
    ev(lc, CS_EV_GETPTR_USED, MT, CAP, 0);
    CHECK(ngot == 1 && got[0].kind == CS_KIND_DLPACK_RECONSUME, "reconsume after release");
    cs_lc_destroy(lc);
    /* renamed used_* a second time */
    lc = fresh(0);
    ev(lc, CS_EV_EXPORT, MT, CAP, 0);
    ev(lc, CS_EV_CONSUME, MT, CAP, 0);
    ev(lc, CS_EV_CONSUME, MT, CAP, 0);
    CHECK(ngot == 1 && got[0].kind == CS_KIND_DLPACK_RECONSUME, "renamed twice");
    cs_lc_destroy(lc);
}

static void test_numpy_blocks(void)
{
    cs_lifecycle *lc = fresh(0);
    cs_event a = {.kind = CS_EV_NP_ALLOC, .obj = 0x5000, .a = 80, .c = 0xAA};
    cs_event f = {.kind = CS_EV_NP_FREE, .obj = 0x5000, .c = 0xAA};
    cs_lc_event(lc, &a);
    cs_lc_event(lc, &f);
    CHECK(ngot == 0, "alloc+free is clean");
    cs_lc_event(lc, &f);
    CHECK(ngot == 1 && got[0].kind == CS_KIND_NUMPY_DOUBLE_FREE, "double free");
    cs_event other = {.kind = CS_EV_NP_FREE, .obj = 0x9000, .c = 0xAA};
    cs_lc_event(lc, &other);
    CHECK(ngot == 1, "an unknown block may predate capsan: no finding");
    cs_event a2 = {.kind = CS_EV_NP_ALLOC, .obj = 0x6000, .a = 8, .c = 0xAA};
    cs_event f2 = {.kind = CS_EV_NP_FREE, .obj = 0x6000, .c = 0xBB};
    cs_lc_event(lc, &a2);
    cs_lc_event(lc, &f2);
    CHECK(ngot == 2 && got[1].kind == CS_KIND_NUMPY_STALE_HANDLER && got[1].detail == CS_STALE_OTHER,
          "freed by another handler");
    cs_event a3 = {.kind = CS_EV_NP_ALLOC, .obj = 0x7000, .a = 16, .c = 0xAA};
    cs_event a4 = {.kind = CS_EV_NP_ALLOC, .obj = 0x5000, .a = 32, .c = 0xAA};
    cs_event a5 = {.kind = CS_EV_NP_ALLOC, .obj = 0x4000, .a = 8, .c = 0xCC};
    cs_lc_event(lc, &a3);
    cs_lc_event(lc, &a4);
    cs_lc_event(lc, &a5);
    uint64_t *live;
    size_t nlive = cs_lc_live_from(lc, CS_NS_NUMPY, 0xAA, 0, &live);
    CHECK(nlive == 2 && live[0] == 0x5000 && live[1] == 0x7000, "the handler's live blocks, sorted");
    free(live);
    /* 0x5000 is still referred to by a Python object: held, not judged */
    const uint64_t held[] = {0x5000};
    CHECK(cs_lc_report_live(lc, CS_NS_NUMPY, 0xAA, 0, held, 1) == 1, "scope leak by handler");
    CHECK(got[ngot - 1].kind == CS_KIND_NUMPY_LEAK && got[ngot - 1].bytes == 16, "numpy-leak");
    cs_lc_finish(lc, CS_END_EXIT);
    /* at exit a held block that is still alive is a leak like any other */
    CHECK(ngot == 5, "exit: the held block and the other handler's, once each: %d", ngot);
    int b32 = 0, b16 = 0;
    for (int i = 3; i < ngot; i++)
        b32 += got[i].bytes == 32, b16 += got[i].bytes == 16;
    CHECK(b32 == 1 && b16 == 0, "the scope's leak not reported twice");
    cs_lc_destroy(lc);
}

/* An API scope that began at time 10: what it may still have to judge
 * (cs_lc_touched_since), and a handler that served an earlier scope too
 * (since_ns in cs_lc_live_from / cs_lc_report_live) */
static void test_scope_since(void)
{
    cs_lifecycle *lc = fresh(0);
    cs_event old = {.kind = CS_EV_NP_ALLOC, .obj = 0x5000, .a = 8, .c = 0xAA, .time_ns = 5};
    cs_event gone = {.kind = CS_EV_NP_ALLOC, .obj = 0x6000, .a = 8, .c = 0xAA, .time_ns = 6};
    cs_event gone_f = {.kind = CS_EV_NP_FREE, .obj = 0x6000, .c = 0xAA, .time_ns = 11};
    cs_lc_event(lc, &old);
    cs_lc_event(lc, &gone);
    cs_lc_event(lc, &gone_f);
    cs_event exp = {.kind = CS_EV_EXPORT, .obj = MT, .a = CAP, .c = 64, .time_ns = 1};
    cs_lc_event(lc, &exp); /* made before the scope */
    CHECK(cs_lc_touched_since(lc, 10) == 0, "nothing alive was made or touched since 10");
    CHECK(cs_lc_touched_since(lc, 0) == 2, "the old block and the tensor are alive");
    cs_event con = {.kind = CS_EV_CONSUME, .obj = MT, .a = CAP, .time_ns = 12};
    cs_lc_event(lc, &con);
    CHECK(cs_lc_touched_since(lc, 10) == 1, "an old tensor consumed in the scope is the scope's");
    cs_event fresh_blk = {.kind = CS_EV_NP_ALLOC, .obj = 0x7000, .a = 16, .c = 0xAA, .time_ns = 13};
    cs_lc_event(lc, &fresh_blk);
    CHECK(cs_lc_touched_since(lc, 10) == 2, "and so is a block made in it");
    uint64_t *live;
    size_t n = cs_lc_live_from(lc, CS_NS_NUMPY, 0xAA, 10, &live);
    CHECK(n == 1 && live[0] == 0x7000, "the handler's blocks of this scope only");
    free(live);
    CHECK(cs_lc_report_live(lc, CS_NS_NUMPY, 0xAA, 10, NULL, 0) == 1 && ngot == 1 &&
              got[0].bytes == 16, "the scope's block is its leak, the earlier one is not");
    CHECK(cs_lc_touched_since(lc, 10) == 1, "a reported leak is judged");
    cs_lc_destroy(lc);
}

/* numpy's small-block cache: legacy blocks (no handler, c == 0) */
static void test_numpy_cached_blocks(void)
{
    cs_lifecycle *lc = fresh(0);
    cs_event a = {.kind = CS_EV_NP_ALLOC, .obj = 0x5000, .a = 8, .c = 0xAA};
    cs_event f = {.kind = CS_EV_NP_FREE, .obj = 0x5000, .c = 0xAA};
    cs_event legacy_free = {.kind = CS_EV_NP_FREE, .obj = 0x5000};
    cs_lc_event(lc, &a);
    cs_lc_event(lc, &f);
    cs_lc_event(lc, &legacy_free);
    CHECK(ngot == 0, "a legacy free after the cache handed the block out unseen: no double free");
    cs_event l1 = {.kind = CS_EV_NP_ALLOC, .obj = 0x6000, .a = 3};
    cs_event l2 = {.kind = CS_EV_NP_ALLOC, .obj = 0x7000, .a = 5};
    cs_event reach = {.kind = CS_EV_NP_REACHABLE, .obj = 0x6000, .a = 0x1000};
    cs_lc_event(lc, &l1);
    cs_lc_event(lc, &l2);
    cs_lc_event(lc, &reach);
    uint64_t *keys;
    size_t n = cs_lc_live_keys(lc, CS_NS_NUMPY, &keys);
    CHECK(n == 2 && keys[0] == 0x6000 && keys[1] == 0x7000, "live keys sorted: %zu", n);
    free(keys);
    cs_lc_finish(lc, CS_END_EXIT);
    CHECK(ngot == 1 && got[0].kind == CS_KIND_NUMPY_LEAK && got[0].obj == 0x7000,
          "the block a module still points to is not a leak; the other is");
    cs_lc_destroy(lc);
}

static void test_tombstones_are_bounded(void)
{
    cs_lifecycle *lc = fresh(0);
    for (uint64_t i = 0; i < 200000; i++) {
        uint64_t mt = 0x100000 + i * 64;
        ev(lc, CS_EV_EXPORT, mt, CAP, 0);
        ev(lc, CS_EV_DELETE, mt, CAP, CS_EVF_IN_DTOR);
    }
    CHECK(ngot == 0, "clean");
    CHECK(cs_lc_live(lc) == 0, "nothing live");
    /* a recent release is still remembered */
    ev(lc, CS_EV_DELETE, 0x100000 + 199999 * 64, 0, 0);
    CHECK(ngot == 1 && got[0].kind == CS_KIND_DLPACK_DOUBLE_DELETE, "recent double delete");
    cs_lc_destroy(lc);
}

static void test_kind_names(void)
{
    for (int k = 1; k < CS_KIND_COUNT; k++)
        CHECK(cs_kind_from_name(cs_kind_name(k)) == k, "round trip of %s", cs_kind_name(k));
    CHECK(cs_kind_from_name("no-such-kind") == CS_KIND_NONE, "unknown name");
}

/* ---- the lock elision: one thread judges alone until a second joins ----
 * Thread 0 exchanges on its own structs; thread 1 starts once thread 0 is
 * well under way, so it must switch the lifecycle to locking while thread 0
 * may be inside an unlocked section. Both use the same stripes: a section
 * left unprotected corrupts a table, loses events or invents findings. */
enum { PER_THREAD = 200000 };
static cs_lifecycle *shared_lc;
static _Atomic long progress;
static _Atomic int thread_findings;

static void count_finding(void *ud, const cs_finding *f)
{
    (void)ud;
    (void)f;
    atomic_fetch_add(&thread_findings, 1);
}

static void locked_event(int kind, uint64_t obj)
{
    static _Atomic uint64_t t;
    cs_event e = {.kind = (uint8_t)kind, .obj = obj, .a = obj + 8, .b = 0x1234, .c = 64,
                  .time_ns = atomic_fetch_add(&t, 1) + 1};
    cs_lc_lock(shared_lc, obj);
    cs_lc_event(shared_lc, &e);
    cs_lc_unlock(shared_lc, obj);
}

static void *exchanger(void *arg)
{
    uint64_t base = (uint64_t)(uintptr_t)arg;
    if (base != 0x10000000)
        while (atomic_load(&progress) < PER_THREAD / 8)
            ;
    for (uint64_t i = 0; i < PER_THREAD; i++) {
        uint64_t mt = base + (i % 4096) * 64; /* addresses come back, as malloc's do */
        locked_event(CS_EV_EXPORT, mt);
        locked_event(CS_EV_CONSUME, mt);
        locked_event(CS_EV_DELETE, mt);
        if (base == 0x10000000)
            atomic_fetch_add(&progress, 1);
    }
    return NULL;
}

static void test_second_thread_joins(void)
{
    shared_lc = cs_lc_create(count_finding, NULL, 1);
    pthread_t th[2];
    pthread_create(&th[0], NULL, exchanger, (void *)(uintptr_t)0x10000000);
    pthread_create(&th[1], NULL, exchanger, (void *)(uintptr_t)0x20000000);
    pthread_join(th[0], NULL);
    pthread_join(th[1], NULL);
    CHECK(cs_lc_events(shared_lc) == 2ull * 3 * PER_THREAD, "events judged: %llu",
          (unsigned long long)cs_lc_events(shared_lc));
    CHECK(atomic_load(&thread_findings) == 0, "clean exchanges made %d finding(s)",
          atomic_load(&thread_findings));
    CHECK(cs_lc_live(shared_lc) == 0, "%zu objects still live", cs_lc_live(shared_lc));
    cs_lc_destroy(shared_lc);
}

static void test_indirect_and_dropped(void)
{
    enum { BLK = 0x9000, BLK2 = 0x9100, BLK3 = 0x9200 };
    cs_lifecycle *lc = fresh(0);
    /* a consumer never deletes a numpy export: the tensor leaks, and the
     * block its manager_ctx holds is the leak's indirect part */
    cs_event e = {.kind = CS_EV_NP_ALLOC, .obj = BLK, .a = 64, .time_ns = 1};
    cs_lc_event(lc, &e);
    ev(lc, CS_EV_EXPORT, MT, CAP, 0);
    e = (cs_event){.kind = CS_EV_CONSUME, .obj = MT, .a = CAP, .c = BLK + 16, .time_ns = 3};
    cs_lc_event(lc, &e);
    /* exported, never consumed, dropped at shutdown by a deleter that
     * freed nothing */
    e = (cs_event){.kind = CS_EV_NP_ALLOC, .obj = BLK2, .a = 32, .time_ns = 4};
    cs_lc_event(lc, &e);
    ev(lc, CS_EV_EXPORT, MT + 64, CAP2, 0);
    e = (cs_event){.kind = CS_EV_DELETE, .obj = MT + 64, .a = CAP2, .c = BLK2, .time_ns = 6,
                   .flags = CS_EVF_IN_DTOR | CS_EVF_NO_PYTHON};
    cs_lc_event(lc, &e);
    e = (cs_event){.kind = CS_EV_DROPPED, .obj = MT + 64, .c = BLK2, .time_ns = 7};
    cs_lc_event(lc, &e);
    /* consumed and released at shutdown by a deleter that kept its array
     * (numpy PR 22510): clean, and so is the block */
    e = (cs_event){.kind = CS_EV_NP_ALLOC, .obj = BLK3, .a = 16, .time_ns = 8};
    cs_lc_event(lc, &e);
    ev(lc, CS_EV_EXPORT, MT + 128, CAP2 + 64, 0);
    e = (cs_event){.kind = CS_EV_CONSUME, .obj = MT + 128, .a = CAP2 + 64, .c = BLK3, .time_ns = 10};
    cs_lc_event(lc, &e);
    e = (cs_event){.kind = CS_EV_DELETE, .obj = MT + 128, .c = BLK3, .time_ns = 11,
                   .flags = CS_EVF_NO_PYTHON};
    cs_lc_event(lc, &e);
    e = (cs_event){.kind = CS_EV_DROPPED, .obj = MT + 128, .c = BLK3, .time_ns = 12};
    cs_lc_event(lc, &e);
    CHECK(ngot == 0, "nothing judged before exit: %d", ngot);
    cs_lc_finish(lc, CS_END_EXIT);
    CHECK(ngot == 2, "two leaks, each with its block indirect: %d finding(s)", ngot);
    CHECK(got[0].kind == CS_KIND_DLPACK_LEAK && got[0].detail == CS_LEAK_CONSUMED &&
              got[0].nindirect == 1 && got[0].indirect_bytes == 64 &&
              got[0].indirect[0].obj == BLK && got[0].indirect[0].kind == CS_KIND_NUMPY_LEAK,
          "consumed, never deleted: its block is indirect");
    CHECK(ngot == 2 && got[1].kind == CS_KIND_DLPACK_LEAK && got[1].detail == CS_LEAK_SHUTDOWN &&
              got[1].nindirect == 1 && got[1].indirect_bytes == 32,
          "dropped at shutdown: a leak with its block indirect");
    cs_lc_destroy(lc);
}

int main(void)
{
    test_clean_exchange();
    test_double_delete();
    test_not_renamed_then_destructor();
    test_delete_then_rename_is_clean();
    test_not_renamed_confirmed_later();
    test_destructor_took_the_tensor();
    test_unchecked_destructor();
    test_destructor_of_a_capsule_at_a_dead_ones_address();
    test_leaks();
    test_indirect_and_dropped();
    test_null_deleter_never_leaks();
    test_reconsume();
    test_numpy_blocks();
    test_scope_since();
    test_numpy_cached_blocks();
    test_tombstones_are_bounded();
    test_kind_names();
    test_second_thread_joins();
    printf("test_lifecycle: %d passed, %d failed\n", checks - failures, failures);
    return failures != 0;
}
