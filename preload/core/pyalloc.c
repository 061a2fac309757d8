/* Python allocator calls inside GIL-less deleters (see pyalloc.h). Outside
 * a deleter each hook costs one thread-local load. */
#include "pyalloc.h"

#include <dlfcn.h>
#include <stddef.h>

#include "runtime.h"

static void *(*mem_malloc)(size_t), *(*mem_calloc)(size_t, size_t), *(*mem_realloc)(void *, size_t);
static void *(*obj_malloc)(size_t), *(*obj_calloc)(size_t, size_t), *(*obj_realloc)(void *, size_t);
static void (*obj_free)(void *);

/* a deleter entered without the GIL is running on this thread: the call
 * site is judged once (runtime.c: dlpack-deleter-no-gil) */
#define IN_NOGIL_DELETER()                                                                \
    do {                                                                                  \
        if (__builtin_expect(cs_in_nogil_deleter, 0))                                     \
            cs_check_gil(__builtin_return_address(0), CS_NOGIL_CAPSULE);                  \
    } while (0)

static void *hook_mem_malloc(size_t n) { IN_NOGIL_DELETER(); return mem_malloc(n); }
static void *hook_mem_calloc(size_t k, size_t n) { IN_NOGIL_DELETER(); return mem_calloc(k, n); }
static void *hook_mem_realloc(void *p, size_t n) { IN_NOGIL_DELETER(); return mem_realloc(p, n); }
static void *hook_obj_malloc(size_t n) { IN_NOGIL_DELETER(); return obj_malloc(n); }
static void *hook_obj_calloc(size_t k, size_t n) { IN_NOGIL_DELETER(); return obj_calloc(k, n); }
static void *hook_obj_realloc(void *p, size_t n) { IN_NOGIL_DELETER(); return obj_realloc(p, n); }
static void hook_obj_free(void *p) { IN_NOGIL_DELETER(); obj_free(p); }

const cs_hook cs_pyalloc_hooks[] = {
    {"PyMem_Malloc", (void *)hook_mem_malloc, NULL},
    {"PyMem_Calloc", (void *)hook_mem_calloc, NULL},
    {"PyMem_Realloc", (void *)hook_mem_realloc, NULL},
    {"PyObject_Malloc", (void *)hook_obj_malloc, NULL},
    {"PyObject_Calloc", (void *)hook_obj_calloc, NULL},
    {"PyObject_Realloc", (void *)hook_obj_realloc, NULL},
    {"PyObject_Free", (void *)hook_obj_free, NULL},
};
const int cs_pyalloc_nhooks = sizeof cs_pyalloc_hooks / sizeof cs_pyalloc_hooks[0];

int cs_pyalloc_ready(void)
{
    *(void **)&mem_malloc = dlsym(RTLD_DEFAULT, "PyMem_Malloc");
    *(void **)&mem_calloc = dlsym(RTLD_DEFAULT, "PyMem_Calloc");
    *(void **)&mem_realloc = dlsym(RTLD_DEFAULT, "PyMem_Realloc");
    *(void **)&obj_malloc = dlsym(RTLD_DEFAULT, "PyObject_Malloc");
    *(void **)&obj_calloc = dlsym(RTLD_DEFAULT, "PyObject_Calloc");
    *(void **)&obj_realloc = dlsym(RTLD_DEFAULT, "PyObject_Realloc");
    *(void **)&obj_free = dlsym(RTLD_DEFAULT, "PyObject_Free");
    return mem_malloc && mem_calloc && mem_realloc && obj_malloc && obj_calloc && obj_realloc &&
           obj_free;
}
