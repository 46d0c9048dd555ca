/* Reduce, as a kernel: the sum, min or max of `count` items of this agent's block of the
 * global array, from item `first` of its "array" region. A reduce over several agents is one
 * call per agent, sent together; the caller combines the partial results.
 *
 * The same source is compiled twice: to bitcode (what bitship ships) and natively into xagent
 * (BS_REDUCE_ENTRY=bs_native_reduce, the pre-installed handler it is measured against). */
#include <bitship/kernel.h>

#include "reduce_abi.h"

#ifndef BS_REDUCE_ENTRY
#define BS_REDUCE_ENTRY reduce
#endif

BS_KERNEL(BS_REDUCE_ENTRY) {
    size_t len = 0;
    const struct bs_reduce_args* in = (const struct bs_reduce_args*)bs_args(ctx, &len);
    if (len != sizeof *in) {
        bs_fail(ctx, BS_REDUCE_EARGS, "reduce: expected {first, count, op, reserved} (24 bytes)");
        return;
    }
    if (in->op > BS_REDUCE_MAX || in->reserved != 0) {
        bs_fail(ctx, BS_REDUCE_EARGS, "reduce: op must be 0 (sum), 1 (min) or 2 (max), reserved 0");
        return;
    }
    size_t size = 0;
    const uint64_t* items = (const uint64_t*)bs_region(ctx, BS_ARRAY_REGION, &size);
    if (!items) {
        bs_fail(ctx, BS_REDUCE_ENOREGION, "reduce: this agent has no region '" BS_ARRAY_REGION "'");
        return;
    }
    uint64_t held = size / sizeof(uint64_t);
    if (in->first > held || in->count > held - in->first) {
        bs_fail(ctx, BS_REDUCE_ERANGE, "reduce: items outside region '" BS_ARRAY_REGION "'");
        return;
    }
    const uint64_t* at = items + in->first;
    uint64_t n = in->count;
    struct bs_reduce_result out = {0, n};
    if (in->op == BS_REDUCE_SUM) {
        uint64_t sum = 0;
        for (uint64_t i = 0; i < n; ++i) sum += at[i];
        out.value = sum;
    } else if (in->op == BS_REDUCE_MIN) {
        uint64_t min = UINT64_MAX;
        for (uint64_t i = 0; i < n; ++i) min = at[i] < min ? at[i] : min;
        out.value = min;
    } else {
        uint64_t max = 0;
        for (uint64_t i = 0; i < n; ++i) max = at[i] > max ? at[i] : max;
        out.value = max;
    }
    bs_reply(ctx, &out, sizeof out);
}
