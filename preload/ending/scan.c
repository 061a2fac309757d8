/* One reachability scan of the whole process (see scan.h). */
#include "scan.h"

#include "arrow.h"
#include "dataindex.h"
#include "ownheap.h"
#include "quarantine.h"
#include "reach.h"
#include "runtime.h"
#include "young.h"

int cs_scan_process(const uint64_t *keys, size_t n, const void *also, size_t also_n,
                    cs_root_cb cb, void *ud)
{
    cs_reach *r = cs_reach_new(keys, n);
    if (!r)
        return -1;
    cs_reach_own(r, also, also_n);
    cs_oh_own_memory(cs_reach_own, r); /* all of capsan's own blocks */
    cs_lc_own_memory(cs_lc, cs_reach_own, r);
    cs_young_own_memory(cs_reach_own, r);
    cs_findings_own_memory(cs_reach_own, r);
    cs_qr_own_memory(cs_reach_own, r); /* freed blocks, their free deferred */
    cs_ar_own_memory(cs_reach_own, r);
    cs_di_own_memory(cs_reach_own, r); /* consumed tensors' keys by data start */
    cs_reach_run(r, cb, ud);
    return 0;
}
