/* The background load bench/planner puts on a "busy" agent: a kernel that keeps one worker
 * busy for about `turns` multiply-adds. */
#include <bitship/kernel.h>

BS_KERNEL(burn) {
    size_t len = 0;
    const uint64_t* turns = (const uint64_t*)bs_args(ctx, &len);
    if (len != sizeof *turns) {
        bs_fail(ctx, 1, "burn: expected {u64 turns}");
        return;
    }
    volatile uint64_t x = 1;
    for (uint64_t i = 0; i < *turns; ++i) x = x * 6364136223846793005ull + 1442695040888963407ull;
    uint64_t out = x;
    bs_reply(ctx, &out, sizeof out);
}
