/* Kernels that keep an agent's workers busy for as long as a test wants, without a clock. */
#include <bitship/kernel.h>

/* Counts itself into word 0 of the operator's region "gate", then spins until word 1 is set
 * (the test PUTs it). The agent's kernel timeout stops it should the test never release it. */
BS_KERNEL(hold_until_released) {
    size_t size = 0;
    uint64_t* gate = (uint64_t*)bs_region(ctx, "gate", &size);
    if (!gate || size < 2 * sizeof(uint64_t)) {
        bs_fail(ctx, 1, "hold_until_released needs a region 'gate' of at least 16 bytes");
        return;
    }
    __atomic_fetch_add(&gate[0], 1, __ATOMIC_SEQ_CST);
    while (__atomic_load_n(&gate[1], __ATOMIC_ACQUIRE) == 0) {
    }
    uint64_t out = 1;
    bs_reply(ctx, &out, sizeof out);
}

/* Answers at once. */
BS_KERNEL(answer_now) {
    uint64_t out = 7;
    bs_reply(ctx, &out, sizeof out);
}
