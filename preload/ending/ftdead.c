/* Dead objects in free-threaded builds' mimalloc pages (ftdead.h). Reads
 * its copy of the memory and, for a type, process_vm_readv: a word that
 * is not an address faults nothing. */
#include "ftdead.h"

#include "peek.h"

int cs_ft_word_in_dead_object(const uint64_t *w, size_t k, uintptr_t type_type,
                              size_t ob_type_off)
{
    const size_t tw = ob_type_off / 8; /* the type's word in the head */
    if (!type_type || ob_type_off != 24)
        return 0;
    /* a head's words before its type are refcounts and flags, never a
     * field: the hit lies at least a type word past a head's start */
    for (size_t back = tw + 1; back <= k && back <= CS_FTDEAD_BACK; back++) {
        size_t s = k - back; /* a candidate head's first word */
        uint64_t tp = w[s + tw];
        if (!tp || (tp & 7) || !cs_peek_is_type(tp, type_type, ob_type_off))
            continue;
        /* the nearest head: the hit is inside this object or in none */
        uint64_t basic, item;
        /* PyTypeObject after its (variable) head: ob_size, tp_name,
         * tp_basicsize, tp_itemsize */
        if (!cs_peek_word(tp + ob_type_off + 8 + 8 + 8, &basic) ||
            !cs_peek_word(tp + ob_type_off + 8 + 8 + 16, &item))
            return 0;
        if (item != 0 || basic < ob_type_off + 8 || back * 8 >= basic)
            return 0; /* a variable-size object, or the hit lies past it */
        /* ob_ref_local is the high half of the head's second word,
         * ob_ref_shared its third: both 0 only once deallocated */
        return (w[s + 1] >> 32) == 0 && w[s + 2] == 0;
    }
    return 0;
}
