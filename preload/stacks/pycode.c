/* Python code objects, interned (stack_int.h): a frame's code becomes an
 * id, its file and function names written to the trace once per file
 * (CS_REC_CODE).
 *
 * With the GIL, a code object is interned for good: its names are copied
 * and a reference keeps its address from being reused. A thread that
 * released the GIL in C code (ctypes does around every foreign call) may
 * neither call into Python nor take a reference; but its own frames hold
 * their code objects, whose names are immutable str objects, so ASCII
 * names are read in place. Such an entry is weak: each later use first
 * checks that the object at that address still has the same name objects
 * and first line, else it is a new code object. */
#include "stack_int.h"

#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "spin.h"
#include "tracefile.h"
#include "alloc.h"

static cs_spin code_mu = CS_SPIN_INIT;
static code_obj **code_keys;   /* open addressing; strong refs unless weak */
static uint32_t *code_vals;
static size_t code_cap, code_used;
static code_info *_Atomic code_tab[4096]; /* chunks of 1024 */
static _Atomic uint32_t code_count;   /* ids are 1..code_count */

code_info *code_at(uint32_t id)
{
    code_info *c = atomic_load_explicit(&code_tab[id >> 10], memory_order_acquire);
    return c ? &c[id & 1023] : NULL;
}

void code_write(uint32_t id)
{
    code_info *c = code_at(id);
    uint32_t g = cs_trace_gen();
    if (!c || atomic_load(&c->gen) == g)
        return;
    atomic_store(&c->gen, g);
    cs_rec_code r = {.code_id = id, .firstlineno = c->firstlineno,
                     .filename_len = (uint32_t)strlen(c->file),
                     .name_len = (uint32_t)strlen(c->name)};
    const char *strs[2] = {c->file, c->name};
    cs_trace_write_strs(CS_REC_CODE, &r, sizeof r, strs, 2);
}

/* a str's text with the GIL (may fill its UTF-8 cache), or "?" */
static char *utf8_copy(PyObject_ *s)
{
    const char *u = s ? cs_py.Unicode_AsUTF8(s) : NULL;
    return cs_strdup(u ? u : "?");
}

/* the entry still describes the code object at its address */
static int code_same(const code_info *c, const code_obj *co)
{
    const cs_pylayout *l = cs_py.layout;
    return !c->weak || (AT(co, l->co_filename, const void *) == c->fobj &&
                        AT(co, l->co_name, const void *) == c->nobj &&
                        AT(co, l->co_firstlineno, int) == (int)c->firstlineno);
}

/* code_mu held: co's slot in the table (its key, or the empty slot where
 * it goes), the table grown first if needed; SIZE_MAX when out of memory */
static size_t code_slot(const code_obj *co)
{
    if ((code_used + 1) * 2 > code_cap) {
        size_t ncap = code_cap ? code_cap * 2 : 1024;
        code_obj **nk = cs_calloc(ncap, sizeof *nk);
        uint32_t *nv = cs_calloc(ncap, sizeof *nv);
        if (!nk || !nv) {
            cs_free(nk);
            cs_free(nv);
            if (code_used + 1 >= code_cap)
                return SIZE_MAX;
        } else {
            for (size_t j = 0; j < code_cap; j++) {
                if (!code_keys[j])
                    continue;
                size_t i = ((uintptr_t)code_keys[j] >> 4) & (ncap - 1);
                while (nk[i])
                    i = (i + 1) & (ncap - 1);
                nk[i] = code_keys[j];
                nv[i] = code_vals[j];
            }
            cs_free(code_keys);
            cs_free(code_vals);
            code_keys = nk;
            code_vals = nv;
            code_cap = ncap;
        }
    }
    size_t m = code_cap - 1, i = ((uintptr_t)co >> 4) & m;
    while (code_keys[i] && code_keys[i] != co)
        i = (i + 1) & m;
    return i;
}

/* code_mu held: a new id for co with these names, stored at slot i */
static uint32_t code_new(code_obj *co, size_t i, char *file, char *name, int weak)
{
    const cs_pylayout *l = cs_py.layout;
    uint32_t id = atomic_load(&code_count) + 1;
    if ((id >> 10) >= 4096 || !file || !name)
        goto fail;
    if (!atomic_load(&code_tab[id >> 10])) {
        code_info *chunk = cs_calloc(1024, sizeof *chunk);
        if (!chunk)
            goto fail;
        atomic_store(&code_tab[id >> 10], chunk);
    }
    code_info *c = code_at(id);
    c->file = file;
    c->name = name;
    c->firstlineno = (uint32_t)AT(co, l->co_firstlineno, int);
    c->importlib = strncmp(file, "<frozen importlib", 17) == 0;
    c->weak = weak;
    c->fobj = AT(co, l->co_filename, const void *);
    c->nobj = AT(co, l->co_name, const void *);
    if (!code_keys[i])
        code_used++;
    code_keys[i] = co;
    code_vals[i] = id;
    atomic_store_explicit(&code_count, id, memory_order_release);
    return id;
fail:
    cs_free(file);
    cs_free(name);
    return 0;
}

/* co's id. With the GIL (gil = 1) it is interned for good; without it, a
 * weak entry is made if need be, and 0 is the answer when co's names are
 * not ASCII (they cannot be read without a call). 0 when out of memory. */
uint32_t code_id(code_obj *co, int gil)
{
    const cs_pylayout *l = cs_py.layout;
    uint32_t id = 0;
    cs_spin_lock(&code_mu);
    size_t i = code_slot(co);
    if (i == SIZE_MAX)
        goto out;
    if (code_keys[i]) {
        code_info *c = code_at(code_vals[i]);
        if (code_same(c, co)) {
            if (gil && c->weak) {
                /* the object a GIL-less read saw: hold it from now on */
                cs_py.IncRef((PyObject_ *)co);
                c->weak = 0;
            }
            id = code_vals[i];
            goto out;
        }
        /* a weak entry's object died and its address was reused */
    }
    if (gil) {
        /* a pending exception must survive our string conversions (R5) */
        PyObject_ *et, *ev, *tb;
        cs_py.Err_Fetch(&et, &ev, &tb);
        char *file = utf8_copy(AT(co, l->co_filename, PyObject_ *));
        char *name = utf8_copy(AT(co, l->co_name, PyObject_ *));
        cs_py.Err_Restore(et, ev, tb);
        /* the code object must outlive its id: a reused address would
         * name a different function */
        if ((id = code_new(co, i, file, name, 0)))
            cs_py.IncRef((PyObject_ *)co);
    } else {
        const char *file = ascii_in_place(AT(co, l->co_filename, const void *));
        const char *name = ascii_in_place(AT(co, l->co_name, const void *));
        if (file && name)
            id = code_new(co, i, cs_strdup(file), cs_strdup(name), 1);
    }
out:
    cs_spin_unlock(&code_mu);
    return id;
}

int cs_stack_code(uint32_t id, const char **file, const char **name)
{
    if (!id || id > atomic_load(&code_count))
        return 0;
    code_info *c = code_at(id);
    *file = c->file;
    *name = c->name;
    return 1;
}

