/* capsan trace file format, version 1 (documented in reports/FORMAT.md).
 *
 * Shared by the writer (preload/core/tracefile.c) and the reader
 * (reports/reader.c). Little-endian, x86-64 layout; every record starts on
 * an 8-byte boundary with a cs_rec header whose size counts the header and
 * is a multiple of 8. A zero header marks the end of what was written: the
 * file is grown ahead of the writer and the tail stays zeroed, which is how
 * a SIGKILLed process's trace ends. */
#ifndef CAPSAN_TRACEFMT_H
#define CAPSAN_TRACEFMT_H

#include <stdint.h>

#define CS_TRACE_MAGIC "CAPSANTR"
#define CS_TRACE_VERSION 2u /* 2: LIVE records; readers read 1 too */

typedef struct cs_file_header {
    char magic[8];            /* CS_TRACE_MAGIC, no NUL */
    uint32_t version;         /* CS_TRACE_VERSION */
    uint32_t header_size;     /* sizeof(cs_file_header); records follow */
    uint64_t pid;
    uint64_t ppid;
    uint64_t start_realtime_ns; /* CLOCK_REALTIME at file creation */
    uint64_t start_mono_ns;     /* CLOCK_MONOTONIC at the same moment */
    uint64_t reserved[2];
} cs_file_header; /* 64 bytes */

typedef struct cs_rec {
    uint16_t type;  /* CS_REC_* */
    uint16_t flags;
    uint32_t size;  /* bytes, header included, multiple of 8 */
} cs_rec;

enum cs_rec_type {
    CS_REC_END_OF_DATA = 0, /* a zero header: nothing more was written */
    CS_REC_PAD = 1,         /* filler, skip */
    CS_REC_PROCESS = 2,     /* cs_rec_process + argc NUL-terminated strings */
    CS_REC_MODULE = 3,      /* cs_rec_module + build id bytes + path\0 */
    CS_REC_CODE = 4,        /* cs_rec_code + filename\0 + qualname\0 */
    CS_REC_FRAME = 5,       /* cs_rec_frame: one stack-tree node */
    CS_REC_EVENT = 6,       /* cs_event */
    CS_REC_THREAD = 7,      /* cs_rec_thread + name\0 */
    CS_REC_END = 8,         /* cs_rec_end: how the process ended */
    CS_REC_OPTIONS = 9,     /* the effective CAPSAN_OPTIONS string\0 */
    CS_REC_COUNTS = 10,     /* cs_rec_counts: live objects, sampled over time */
    CS_REC_LIVE = 11,       /* cs_rec_live: slots mirroring the live objects, rewritten
                             * in place as they change (crash-safe live state) */
    CS_REC_CRASH = 12,      /* cs_rec_crash: the crashing thread's stacks, after END */
};

/* The stacks the crash handler walked: nnative u64 addresses (innermost
 * first; the first is the pc itself), then npython frames, innermost
 * first, each a u32 line and two NUL-terminated strings (file, then
 * function), unaligned. */
typedef struct cs_rec_crash {
    uint32_t nnative;
    uint32_t npython;
    uint64_t os_tid;      /* the crashing thread */
} cs_rec_crash;

typedef struct cs_rec_process {
    uint32_t argc;
    uint32_t reserved;
    /* then argc NUL-terminated argv strings, then the exe path\0 */
} cs_rec_process;

typedef struct cs_rec_module {
    uint64_t base;        /* load bias (dlpi_addr) */
    uint64_t lo, hi;      /* absolute [lo, hi) covered by its PT_LOAD segments */
    uint32_t build_id_len;
    uint32_t path_len;    /* strlen(path) */
    /* then build_id_len bytes, then path\0 */
} cs_rec_module;

typedef struct cs_rec_code {
    uint32_t code_id;     /* referenced by Python frame values */
    uint32_t firstlineno;
    uint32_t filename_len;
    uint32_t name_len;
    /* then filename\0 qualname\0 */
} cs_rec_code;

/* A stack is a path in a prefix tree, stored leaf id in events. Node 0 is
 * the empty stack. Walking parent links from the leaf yields the frames
 * innermost first: first the native frames, then the Python frames. */
typedef struct cs_rec_frame {
    uint32_t id;
    uint32_t parent;
    uint64_t value;       /* see CS_FRAME_* */
} cs_rec_frame;

/* Frame values: a native frame is its return address (bit 63 clear); a
 * Python frame has bit 63 set, bit 62 when it is the outermost frame of one
 * C-level evaluation (CPython's is_entry), the code id in bits 32..61 and the
 * line number in bits 0..31. */
#define CS_FRAME_PY (1ull << 63)
#define CS_FRAME_PY_ENTRY (1ull << 62)
#define CS_FRAME_PY_VALUE(code, line, entry) \
    (CS_FRAME_PY | ((entry) ? CS_FRAME_PY_ENTRY : 0) | \
     ((uint64_t)((code) & 0x3fffffffu) << 32) | (uint32_t)(line))
#define CS_FRAME_IS_PY(v) (((v) & CS_FRAME_PY) != 0)
#define CS_FRAME_PY_CODE(v) ((uint32_t)(((v) >> 32) & 0x3fffffffu))
#define CS_FRAME_PY_LINE(v) ((uint32_t)(v))
#define CS_FRAME_PY_IS_ENTRY(v) (((v) & CS_FRAME_PY_ENTRY) != 0)

/* Written while events happen (every 10 ms for the first 10 s, then at a
 * thousandth of the time run so far), and once at the end: the series
 * behind the report's live-memory plot (the trace itself keeps only the
 * events of objects with findings). */
/* One live object, mirrored into the trace while it lives (key 0: a free
 * slot). A process killed without an END record still says what it held. */
typedef struct cs_live_slot {
    uint64_t obj;         /* the struct (DLPack) or data pointer (NumPy); 0 = free */
    uint64_t bytes;
    uint64_t time_ns;     /* of the creating event */
    uint32_t stack;       /* the creating event's stack */
    uint32_t consume_stack; /* DLPack: where it was consumed, 0 if not */
    uint32_t thread;
    uint8_t kind;         /* the creating event's kind (CS_EV_EXPORT, CS_EV_NP_ALLOC) */
    uint8_t flags;        /* the creating event's flags */
    uint16_t aux;         /* the creating event's aux */
} cs_live_slot; /* 40 bytes */

typedef struct cs_rec_live {
    uint32_t nslots;
    uint32_t reserved;
    /* cs_live_slot slots[nslots] */
} cs_rec_live;

typedef struct cs_rec_counts {
    uint64_t time_ns;         /* CLOCK_MONOTONIC */
    uint64_t events;          /* events observed so far */
    uint64_t live_dlpack;     /* exported tensors not yet released */
    uint64_t live_dlpack_bytes;
    uint64_t live_numpy;      /* NumPy data blocks allocated, not freed */
    uint64_t live_numpy_bytes;
} cs_rec_counts;

typedef struct cs_rec_thread {
    uint32_t thread;      /* capsan's thread number, 1 = first seen */
    uint32_t reserved;
    uint64_t os_tid;
    /* then name\0 */
} cs_rec_thread;

/* QUICK_EXIT is _exit()/os._exit(): nothing was cleaned up, so, as with
 * LeakSanitizer, no leak check. HALT is halt_on_error. API_EXIT is the
 * end (exit or _exit) of a process capsan ran in API mode (`import
 * capsan`): its leaks were judged in capsan.trace() scopes, none at exit.
 * STOPPED_EXIT is the end of a process that stopped capsan
 * (capsan.stop()): releases after the stop were not seen, so no leak
 * check either. */
enum cs_end_how { CS_END_UNKNOWN = 0, CS_END_EXIT = 1, CS_END_SIGNAL = 2, CS_END_HALT = 3,
                  CS_END_QUICK_EXIT = 4, CS_END_API_EXIT = 5, CS_END_STOPPED_EXIT = 6 };

typedef struct cs_rec_end {
    uint32_t how;         /* cs_end_how */
    int32_t status;       /* exit status, or the signal number */
    uint64_t time_ns;     /* CLOCK_MONOTONIC */
    uint64_t fault_addr;  /* signal: si_addr */
    uint64_t pc;          /* signal: the faulting instruction */
    uint64_t events;      /* events observed (the trace holds those of objects with findings) */
    /* appended later (older END records end before them; readers take
     * what is there): what the process watched, and its findings */
    uint64_t tensors;     /* DLPack tensors born (capsules and the exchange API) */
    uint64_t blocks;      /* NumPy data blocks allocated */
    uint32_t findings;    /* findings reported (suppressed ones excluded) */
    uint32_t reserved;
    uint64_t arrow;       /* appended later: Arrow structs exported (stream chunks included) */
} cs_rec_end;

/* One lifecycle event: the payload of CS_REC_EVENT and the input of
 * lifecycle.c. Field use per kind is listed beside each CS_EV_*. */
/* The kind of memory a REACHABLE word lies in (0: not recorded) */
enum cs_where {
    CS_WHERE_UNKNOWN = 0,
    CS_WHERE_DATA = 1,  /* a loaded object's writable data (.data, .bss, .got) */
    CS_WHERE_HEAP = 2,  /* the brk heap: malloc's main arena */
    CS_WHERE_STACK = 3, /* the main thread's stack */
    CS_WHERE_ANON = 4,  /* an anonymous mapping: the interpreter's object arenas, large
                         * or other threads' malloc blocks, other threads' stacks */
    CS_WHERE_THREAD = 5, /* no scan: at exit, its latest event ran on a Python thread
                          * still running (a daemon thread), b = that thread's number */
    CS_WHERE_THREAD_FRAMES = 6, /* at atexit, the frames of a Python thread still running
                                 * (a daemon thread) reached its array, b = that thread's
                                 * number (0: it made no event) */
    CS_WHERE_ARROW_BUFFER = 7, /* at atexit, a pyarrow buffer that a module reached was made
                                * around its array (zero-copy), a = the buffer's address */
    CS_WHERE_MODULE_KEPT = 8, /* at atexit, a module's globals reached its array, and the
                               * interpreter never cleared them */
    CS_WHERE_PY_REACHED = 9, /* at atexit, a module's globals reached it, and it outlived
                              * their clearing: an object that survived finalization
                              * (pytest's items, a library's cache) still holds it */
};

typedef struct cs_event {
    uint8_t kind;         /* CS_EV_* */
    uint8_t flags;        /* CS_EVF_* */
    uint16_t aux;
    uint32_t thread;
    uint64_t time_ns;     /* CLOCK_MONOTONIC */
    uint64_t obj;         /* the object the event is about */
    uint64_t a, b, c;
    uint32_t stack;       /* leaf node id, 0 = no stack */
    uint32_t extra;
} cs_event; /* 56 bytes; the record is 64 */

enum cs_event_kind {
    /* DLPack; obj = the DLManagedTensor(Versioned) struct */
    CS_EV_EXPORT = 1,       /* capsule created: a=capsule b=deleter c=nbytes; aux: CS_DLV_* */
    CS_EV_OWN = 2,          /* numpy's internal numpy_dltensor capsule: a=capsule */
    CS_EV_CONSUME = 3,      /* renamed to used_*: a=capsule b=consumer return address
                             * c=dl_tensor.data (byte_offset with CS_EVF_OFFSET_IGNORED) */
    CS_EV_GETPTR_USED = 4,  /* pointer taken from a consumed capsule: a=capsule */
    CS_EV_DELETE = 5,       /* deleter called: a=capsule whose destructor runs it, or 0; c=dl_tensor.data;
                             * aux=CS_DELETE_NULL_CALL: a call through a NULL deleter (b=caller) */
    CS_EV_DESTROY = 6,      /* capsule destructor returned: a=capsule; aux: CS_NAME_*; extra: CS_DESTROY_* */
    CS_EV_BAD_TENSOR = 7,   /* field check failed: aux=rule (13..21, 1, 7) extra=CS_BAD_* b=value */
    CS_EV_GETPTR = 8,       /* unconsumed capsule read by a consumer: a=capsule */
    CS_EV_NO_GIL = 9,       /* a Python call without the GIL: obj=call site; aux=CS_NOGIL_* */
    CS_EV_DATA_FREED = 11,  /* memory a consumed tensor's data lies in was freed: a=freed pointer;
                             * aux=CS_FREED_* */
    CS_EV_DROPPED = 12,     /* a deleter that ran during interpreter shutdown freed
                             * nothing (no free() or PyMem_Free() in the call):
                             * c=dl_tensor.data; stack: the delete's */
    CS_EV_REACHABLE = 13,   /* at _exit, a live tensor's address is stored in the
                             * process's writable memory: a=where; aux: CS_WHERE_* */
    CS_EV_DEVICE = 10,      /* export of data from a device handler: obj=struct b=data c=handler; aux=device */
    /* DLPack 1.3's exchange API (no capsule): births are EXPORT events
     * with a CS_DLV_X* aux bit, a=dl_tensor.data, b=deleter, c=nbytes */
    CS_EV_XHANDOVER = 14,   /* a live tensor given to managed_tensor_to_py_object_no_sync,
                             * which took it: a=table (capsan's index in extra), b=caller */
    CS_EV_XCHECK = 15,      /* an exchange-API call broke its contract (R51-R56) or a table
                             * is malformed (R50): obj=tensor or table; aux=CS_XC_*;
                             * a=return code, b=value, extra=entry (CS_XE_*) */
    /* NumPy data memory (issue 3), kinds 16..23; obj = the data pointer */
    CS_EV_NP_ALLOC = 16,    /* a=size b=handler capsule c=handler struct; extra=its allocator's
                             * ctx and functions hashed (nonzero; 0 = no handler) */
    CS_EV_NP_FREE = 17,     /* a=the same hash now (0 = not read) b=handler capsule c=handler
                             * struct; extra=CS_STALE_* or 0 */
    CS_EV_NP_HANDLER = 18,  /* handler seen: obj=handler struct a=capsule; extra=CS_BAD_* or 0 */
    CS_EV_NP_FOREIGN_FREE = 19, /* numpy free()d an OWNDATA array's data that no handler gave */
    CS_EV_NP_REACHABLE = 20, /* at exit, a live block's address is in a module's static
                              * data (numpy's small-block cache): a=where, b=module base;
                              * at _exit anywhere (b=0); aux: CS_WHERE_* */
    CS_EV_NP_WRAP = 21,     /* an extension made an array around the memory obj lies in
                             * (stack: where); a=array data, b=bytes spanned, c=lowest
                             * byte. Emitted just before the NP_FOREIGN_FREE of obj. */
    CS_EV_NP_ORPHAN = 22,   /* the handler that made live block obj died (its struct or
                             * ctx freed; stack: where): c=handler struct; extra=CS_STALE_* */
    /* DLPack again, from 24 */
    CS_EV_ERR_STATE = 24,   /* a capsule destructor (a = capsule) or a deleter (a = 0) returned
                             * with the Python error indicator changed: aux = CS_ERRST_* */
    /* The Arrow PyCapsule interface (issue 19), kinds 25..31; obj = capsan's record of one
     * exported struct, which every bitwise copy of the struct carries (preload/arrow/) */
    CS_EV_AR_EXPORT = 25,   /* a=capsule (0: a stream callback's result) b=struct
                             * c=the stream's record (a stream callback's result);
                             * aux=CS_AR_* type | CS_AR_FROM_* | CS_AR_UNFOLLOWED */
    CS_EV_AR_BORROW = 26,   /* a consumer read the capsule: a=capsule b=struct; aux: CS_ARB_* */
    CS_EV_AR_RELEASE = 27,  /* its release ran: a=the struct it ran on; aux: CS_ARR_* */
    CS_EV_AR_CALL = 28,     /* a stream callback called out of turn: aux=CS_ARC_* a=rc
                             * extra=the thread already inside (CS_ARC_CONCURRENT) */
    CS_EV_AR_DESTROY = 29,  /* its capsule's destructor returned: a=capsule; aux=CS_ARD_*,
                             * extra: CS_ARDX_* */
    CS_EV_AR_CHECK = 30,    /* renamed or malformed: a=capsule; aux=CS_ARK_*, b=value */
    CS_EV_AR_REACHABLE = 31, /* at exit, a live struct still holds its record (something
                              * keeps it): a=where; aux: CS_WHERE_* */
    /* DLPack again, from 32 */
    CS_EV_REEXPORT = 32,    /* a consumed tensor's memory exported again from its data field,
                             * byte_offset dropped: obj = the consumed tensor, a = the new
                             * struct, b = its first element, c = the dropped byte_offset;
                             * stack: the new export's */
};
#define CS_EV_IS_ARROW(kind) ((kind) >= CS_EV_AR_EXPORT && (kind) <= 31)
/* CS_EV_AR_EXPORT aux: the struct's type (low 4 bits) and where it came from */
enum cs_ar_type { CS_AR_SCHEMA = 1, CS_AR_ARRAY = 2, CS_AR_STREAM = 3, CS_AR_DEVICE_ARRAY = 4,
                  CS_AR_DEVICE_STREAM = 5 };
#define CS_AR_TYPE(aux) ((aux) & 15u)
#define CS_AR_FROM_NEXT 0x10u   /* returned by a stream's get_next */
#define CS_AR_FROM_SCHEMA 0x20u /* returned by a stream's get_schema */
#define CS_AR_UNFOLLOWED 0x40u  /* arrow_wrap=0: its struct is never written, so moves and
                                 * releases are not followed */
#define CS_AR_BY_ADDR 0x80u     /* handed over by address (R49): filled by an export function
                                 * (arrow::Export*), or met first at an import */
#define CS_AR_FOUND 0x100u      /* with BY_ADDR: first met at an import, born in a library
                                 * capsan never saw export it: c=its release callback */
#define CS_AR_MOVED_KID 0x200u  /* arrow_deep=1: a child or dictionary its consumer moved out
                                 * of its parent, followed on its own from where the move is
                                 * first seen (the parent's capsule's death, or its release): b=where it was,
                                 * c=the parent's exported struct's record */
#define CS_AR_MOVED_EARLY 0x400u /* with MOVED_KID: seen as the parent's capsule died, its
                                 * consumer (the mover) at work: the stack is the mover's */
/* CS_EV_AR_BORROW aux */
#define CS_ARB_RELEASED 1u      /* its release was NULL when read: consumed already */
#define CS_ARB_IMPORT 2u        /* an import by address (arrow::Import*, R49): a move into
                                 * the importer, which owns the release from now on */
#define CS_ARB_OWN 4u           /* with RELEASED: read by the module that made the capsule
                                 * (a library's own placeholder, never handed over) */
/* CS_EV_AR_RELEASE aux */
#define CS_ARR_AGAIN 1u         /* released already (written before this call runs) */
#define CS_ARR_NOT_CLEARED 2u   /* the producer's release returned with release != NULL */
#define CS_ARR_IN_DTOR 4u       /* run by its capsule's destructor */
#define CS_ARR_MOVED 8u         /* run on another struct than the one exported: a moved copy */
#define CS_ARR_CHILD 0x10u      /* arrow_deep=1: the release of a child or dictionary of obj
                                 * (a=its struct), written only when something went wrong */
#define CS_ARR_KIDS_LEFT 0x20u  /* arrow_deep=1: children or a dictionary this release was to
                                 * release (still wrapped where they were, not moved out) were
                                 * not: b=how many, extra=the first one's index (-1: the
                                 * dictionary), c=its struct (R44) */
/* CS_EV_AR_CALL aux: the callback (low byte) and what was wrong */
enum cs_ar_call { CS_ARC_GET_SCHEMA = 1, CS_ARC_GET_NEXT = 2, CS_ARC_GET_LAST_ERROR = 3,
                  CS_ARC_RELEASE = 4 /* with CS_ARC_CONCURRENT only: a stream's release */ };
#define CS_ARC_RELEASED 0x100u  /* on a released stream (R45) */
#define CS_ARC_CONCURRENT 0x200u /* while another thread was inside one of its callbacks */
#define CS_ARC_SAME 0x400u      /* with CS_ARC_RELEASED: through the very struct its release
                                * ran on, not a copy kept from before */
/* CS_EV_AR_DESTROY aux: the struct as its capsule died */
enum cs_ar_destroy {
    CS_ARD_SET = 1,        /* release still set: its destructor must release it (R41) */
    CS_ARD_MOVED = 2,      /* release NULL and no release ran: moved out by a consumer */
    CS_ARD_RELEASED = 3,   /* released before */
    CS_ARD_UNFOLLOWED = 4, /* arrow_wrap=0: not judged */
};
#define CS_ARDX_NO_DTOR 1u /* the capsule had no destructor */
/* CS_EV_AR_CHECK aux */
enum cs_ar_check {
    CS_ARK_RENAMED = 1,     /* PyCapsule_SetName on an Arrow capsule (R40) */
    CS_ARK_RELEASED = 2,    /* its first consumer found it released (R43: handed out empty
                             * or already consumed by its producer) */
    CS_ARK_NULL_CALLBACK = 3, /* a stream without get_schema/get_next/get_last_error: b=CS_ARC_* */
    CS_ARK_DEVICE = 4,      /* device_array: unknown device_type, or a CPU one with a sync
                             * event (R48): b=device_type */
    CS_ARK_BAD_NAME = 5,    /* PyCapsule_New under a near miss of an Arrow name (R40):
                             * obj=the capsule (no record: it is not followed), a, b, c =
                             * the name's first 24 bytes (NUL-padded), extra=the struct it
                             * resembles (cs_ar_type) | CS_ARK_NAME_USED */
    CS_ARK_IMPORT_RELEASED = 6, /* an import by address (R49) of a struct whose release is
                             * NULL and that capsan never saw live: handed over empty or
                             * released; obj=its record, or the struct's address */
};
#define CS_ARK_NAME_USED 0x10u /* CS_ARK_BAD_NAME: with a used_ prefix */
/* the namespace an event's object is in: NumPy's kinds are 16..23 */
#define CS_EV_IS_NUMPY(kind) ((kind) >= CS_EV_NP_ALLOC && (kind) < 24)
/* CS_EV_ERR_STATE aux: what became of the error indicator (R5) */
enum cs_errst { CS_ERRST_CLEARED = 1, CS_ERRST_REPLACED = 2, CS_ERRST_LEFT = 3 };

/* CS_EV_NP_FREE extra: why the handler freeing a block is not fit to */
enum cs_stale {
    CS_STALE_NONE = 0,
    CS_STALE_CHANGED = 1,   /* the handler struct changed (or was freed) since first seen */
    CS_STALE_UNLOADED = 2,  /* its functions are no longer in a loaded object */
    CS_STALE_OTHER = 3,     /* not the handler that allocated the block */
    CS_STALE_CTX_FREED = 4, /* free() was called on the handler's ctx */
    CS_STALE_REPOINTED = 5, /* its ctx or functions were re-pointed in place since the alloc */
};
/* a numpy-stale-handler finding's detail: CS_STALE_* and, when it was told as
 * the handler died (CS_EV_NP_ORPHAN) rather than at the free, this bit */
enum { CS_STALE_AT_DEATH = 0x100 };

/* CS_EV_NO_GIL aux: what was called */
enum cs_nogil { CS_NOGIL_CAPSULE = 1, CS_NOGIL_HANDLER = 2, CS_NOGIL_IN_DELETER = 3 };
/* CS_EV_NO_GIL extra, and CS_EV_XCHECK b with CS_XC_NO_GIL: the process is a
 * free-threaded build, where the rule is an attached thread state */
#define CS_NOGIL_FREE_THREADED 1u

/* CS_EV_EXPORT / CS_EV_CONSUME aux bits */
#define CS_DLV_VERSIONED 1u
#define CS_CONSUME_WRONG_NAME 2u /* CONSUME only: renamed to the other version's used_* name
                                  * (a dltensor_versioned capsule used_dltensor, or back) */
#define CS_CONSUME_VIEW_SEEN 4u /* CONSUME only, with CS_EVF_OFFSET_IGNORED: the array the
                                 * consumer made starts at data (consumer_view.c), not its
                                 * version told */
/* an EXPORT through the exchange API: the birth of an owned tensor (it is
 * consumed from the start), a struct its caller handed to to_py (HANDED:
 * to_py took it; else the call failed and the caller still owns it), or a
 * non-owning view (never a leak) */
#define CS_DLV_XFROM 2u   /* managed_tensor_from_py_object_no_sync */
#define CS_DLV_XALLOC 4u  /* managed_tensor_allocator */
#define CS_DLV_XTO 8u     /* managed_tensor_to_py_object_no_sync: the caller's struct */
#define CS_DLV_XVIEW 16u  /* dltensor_from_py_object_no_sync: obj = the caller's DLTensor */
#define CS_DLV_HANDED 32u /* with XTO: to_py took it */
#define CS_DLV_X (CS_DLV_XFROM | CS_DLV_XALLOC | CS_DLV_XTO | CS_DLV_XVIEW)
/* CS_EV_XCHECK: the table entry (extra) and what was wrong (aux) */
enum cs_xentry { CS_XE_TABLE = 0, CS_XE_ALLOC = 1, CS_XE_FROM_PY = 2, CS_XE_TO_PY = 3,
                 CS_XE_VIEW = 4, CS_XE_STREAM = 5,
                 CS_XE_FFI_CALL = 6 /* tvm-ffi's TVMFFIFunctionCall, around conversions */ };
enum cs_xcheck {
    CS_XC_NONE = 0,
    /* the calling contract: dlpack-exchange-contract */
    CS_XC_RC_NO_ERROR = 1,   /* failed (rc != 0) without a Python exception set */
    CS_XC_OK_WITH_ERROR = 2, /* succeeded (rc == 0) with a Python exception set */
    CS_XC_NO_GIL = 3,        /* a Python-facing entry called without the GIL (R56) */
    CS_XC_SETERROR = 4,      /* the allocator's SetError calls (b) do not match its rc (R54) */
    CS_XC_TO_PY_RELEASED = 5, /* to_py ran the tensor's deleter and then failed (R52) */
    CS_XC_NULL_OUT = 6,      /* succeeded and gave no tensor (R51) */
    CS_XC_FFI_ERROR_LOST = 7, /* an FFI call made after table conversions failed (a: rc) with
                               * its error raised through the FFI's error API, and its Python
                               * call returned without fetching it (R51, at the FFI call) */
    /* the table: dlpack-bad-exchange-table */
    CS_XT_VERSION = 16,      /* version.major is not 1 (b) */
    CS_XT_NULL_ENTRY = 17,   /* a required entry is NULL (b: CS_XE_*) */
    CS_XT_NOT_STATIC = 18,   /* the table lies in no loaded object (heap or stack) */
    CS_XT_PREV = 19,         /* prev_api does not point to an older table */
};
#define CS_XC_TABLE_FIRST CS_XT_VERSION
/* CS_EV_DATA_FREED aux: how it was freed */
#define CS_FREED_LIBC 1u  /* free() */
#define CS_FREED_PYMEM 2u /* PyMem_Free() */
/* a finding's detail only: the view freed was one kept past its call */
#define CS_FREED_KEPT 0x10u
/* CS_EV_DELETE aux */
#define CS_DELETE_NULL_CALL 1u
#define CS_DELETE_VIEW_END 2u /* a view (CS_DLV_XVIEW) stopped being valid: its caller returned */
#define CS_DELETE_VIEW_KEPT 3u /* its caller returned and kept the DLTensor off its stack (a the
                               * DLTensor's address): the view lives on, as a stale one */
/* CS_EV_DESTROY aux: the capsule's name when it died */
enum cs_name_state { CS_NAME_UNCONSUMED = 0, CS_NAME_USED = 1, CS_NAME_OTHER = 2 };
/* CS_EV_DESTROY extra bits */
#define CS_DESTROY_NO_DTOR 1u /* the capsule had no destructor */
#define CS_DESTROY_TOOK 2u    /* its destructor read the pointer under the unconsumed name */
#define CS_DESTROY_REENTERED 4u /* the destructor was entered again for this capsule while it
                                 * ran (R4; written at the re-entry, before it runs) */

/* cs_event.flags */
#define CS_EVF_GIL 0x01         /* the calling thread held the GIL */
#define CS_EVF_SKIPPED 0x02     /* protect=1: the call was not executed */
#define CS_EVF_NULL_DELETER 0x04 /* EXPORT with deleter == NULL */
#define CS_EVF_IN_DTOR 0x08     /* DELETE from inside a capsule destructor (a) */
#define CS_EVF_OFFSET_IGNORED 0x10 /* CONSUME by a consumer that ignores byte_offset (b) */
#define CS_EVF_NO_PYTHON 0x20   /* Py_IsInitialized() was false */
#define CS_EVF_IMPORT 0x40      /* made while a module was being imported (module data),
                                 * or where that cannot be told (no frame layout) */
#define CS_EVF_GIL_KNOWN 0x80   /* in memory only: the hook already checked the GIL and
                                 * CS_EVF_GIL says the answer; never written */

/* CS_EV_BAD_TENSOR detail codes (extra) */
enum cs_bad {
    CS_BAD_NONE = 0,
    CS_BAD_NULL_POINTER,     /* R1: capsule holds NULL */
    CS_BAD_NDIM,             /* R15: ndim < 0 or > 64 */
    CS_BAD_NULL_SHAPE,       /* R15: shape NULL with ndim > 0 */
    CS_BAD_NEGATIVE_SHAPE,   /* R15: a negative extent */
    CS_BAD_NULL_STRIDES_V12, /* R16: strides NULL with version >= 1.2 */
    CS_BAD_DTYPE_CODE,       /* R18: unknown type code */
    CS_BAD_DTYPE_BITS,       /* R18: bits not a multiple of 8 (or bad sub-byte width) */
    CS_BAD_DTYPE_LANES,      /* R18: lanes == 0 */
    CS_BAD_DEVICE_TYPE,      /* R19: unknown device type */
    CS_BAD_DEVICE_ID,        /* R19: device_id != 0 for CPU-like memory */
    CS_BAD_VERSION_MAJOR,    /* R13: major != 1 in a versioned capsule */
    CS_BAD_FLAGS,            /* R21: unknown flag bits */
    CS_BAD_MUTATED,          /* R20: shape/strides/data changed while loaned */
    CS_BAD_RENAME,           /* R7: renamed to an unexpected name */
    CS_BAD_NULL_DATA,        /* R17: data NULL with elements > 0 */
    CS_BAD_BOOL_BITS,        /* R18: bool with bits != 8 */
    CS_BAD_UNREADABLE,       /* R1: the capsule's pointer is not readable memory */
    CS_BAD_UNREADABLE_SHAPE, /* R15: shape is not readable memory */
    CS_BAD_RENAME_VERSION,   /* R8: renamed to the other DLPack version's consumed name */
    /* NumPy handlers (R27) */
    CS_BAD_HANDLER_NAME = 32,  /* capsule not named mem_handler */
    CS_BAD_HANDLER_VERSION,    /* version != 1 */
    CS_BAD_HANDLER_NULL_FN,    /* a NULL function */
    CS_BAD_HANDLER_UNTERMINATED, /* name not NUL-terminated within 127 bytes */
};

#endif
