/* Filter/gather, as a kernel: the items among `count` of this agent's block of the global
 * array (from item `first` of its "array" region) that match the predicate of filter_abi.h,
 * in order. A filter over several agents is one call per agent, sent together; the caller
 * concatenates the answers in agent order.
 *
 * The same source is compiled twice: to bitcode (what bitship ships) and natively into xagent
 * (BS_FILTER_ENTRY=bs_native_filter). */
#include <bitship/kernel.h>

#include "filter_abi.h"

#ifndef BS_FILTER_ENTRY
#define BS_FILTER_ENTRY filter
#endif

/* From the agent's curated libc (the sandbox's per-call heap under --sandbox sfi). Declared
 * here: a freestanding slice has no <stdlib.h>. */
void* malloc(size_t size);
void free(void* p);

BS_KERNEL(BS_FILTER_ENTRY) {
    size_t len = 0;
    const struct bs_filter_args* in = (const struct bs_filter_args*)bs_args(ctx, &len);
    if (len != sizeof *in) {
        bs_fail(ctx, BS_FILTER_EARGS, "filter: expected {first, count, threshold, reserved} (24 bytes)");
        return;
    }
    if (in->threshold > BS_FILTER_THRESHOLD_MAX || in->reserved != 0) {
        bs_fail(ctx, BS_FILTER_EARGS, "filter: threshold must be 0..1024, reserved 0");
        return;
    }
    size_t size = 0;
    const uint64_t* items = (const uint64_t*)bs_region(ctx, BS_ARRAY_REGION, &size);
    if (!items) {
        bs_fail(ctx, BS_FILTER_ENOREGION, "filter: this agent has no region '" BS_ARRAY_REGION "'");
        return;
    }
    uint64_t held = size / sizeof(uint64_t);
    if (in->first > held || in->count > held - in->first) {
        bs_fail(ctx, BS_FILTER_ERANGE, "filter: items outside region '" BS_ARRAY_REGION "'");
        return;
    }
    const uint64_t* at = items + in->first;
    uint64_t n = in->count;
    uint32_t threshold = in->threshold;
    if (n == 0) {
        bs_reply(ctx, 0, 0);
        return;
    }
    uint64_t* out = (uint64_t*)malloc((size_t)n * sizeof(uint64_t)); /* the worst case: all match */
    if (!out) {
        bs_fail(ctx, BS_FILTER_ENOMEM, "filter: no memory for the matching items");
        return;
    }
    uint64_t kept = 0;
    for (uint64_t i = 0; i < n; ++i) {
        uint64_t x = at[i];
        if (bs_filter_match(x, threshold)) out[kept++] = x;
    }
    if (bs_reply(ctx, out, (size_t)kept * sizeof(uint64_t)) == BS_ETOOLARGE)
        bs_fail(ctx, BS_FILTER_ETOOLARGE, "filter: the matching items exceed the agent's result limit (--max-result)");
    free(out);
}
