/* GOT/PLT slot patching. Symbol interposition cannot reach PyCapsule_* in a
 * statically linked python (the executable defines them and is searched
 * first), so every loaded object's relocation slots (DT_JMPREL, DT_RELA,
 * DT_REL) for the hooked names are rewritten in place. Each object is
 * patched once; cs_got_scan() after a dlopen only visits new ones. */
#ifndef CAPSAN_GOT_H
#define CAPSAN_GOT_H

typedef struct cs_hook {
    const char *name;
    void *replacement;
    const char *only_in; /* patch only objects whose path contains this, or NULL */
} cs_hook;

/* The hook table lives for the process; `self` is any address inside
 * libcapsan.so (its own slots are never patched). */
void cs_got_init(const cs_hook *hooks, int n, const void *self);
/* Patch objects loaded since the last scan. Returns how many were patched. */
int cs_got_scan(void);
/* Forget objects that were unloaded (after dlclose). */
void cs_got_forget_unloaded(void);
/* Write every original value back (capsan.stop()). */
void cs_got_restore(void);
/* Totals for verbosity and tests. */
void cs_got_stats(unsigned *objects, unsigned *slots);

#endif
