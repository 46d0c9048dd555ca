/* A compute kernel for bench/jit_tiers: time spent in generated code, not in the call. */
#include <bitship/kernel.h>

struct mix_args {
    uint64_t seed, rounds;
    uint64_t table[16];
};

/* `rounds` of a 64-bit LCG, each output folded into a small table and a sum: arithmetic,
 * loads, stores and a data-dependent index, so code quality shows. Answers the sum. */
BS_KERNEL(mix) {
    size_t len;
    const struct mix_args* in = (const struct mix_args*)bs_args(ctx, &len);
    if (len != sizeof *in) {
        bs_fail(ctx, 1, "mix: expected 144 bytes of arguments");
        return;
    }
    uint64_t table[16];
    for (int i = 0; i < 16; ++i) table[i] = in->table[i];
    uint64_t x = in->seed, sum = 0;
    for (uint64_t r = 0; r < in->rounds; ++r) {
        x = x * 6364136223846793005ull + 1442695040888963407ull;
        uint64_t v = (x >> 29) ^ table[(x >> 60) & 15];
        table[r & 15] += v;
        sum += v * (r | 1);
    }
    bs_reply(ctx, &sum, sizeof sum);
}
