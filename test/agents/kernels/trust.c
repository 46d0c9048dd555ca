/* Kernels for the trust tests: one that forwards itself to another agent before answering. */
#include <bitship/kernel.h>

struct hop_args {
    uint32_t to; /* the peer index that answers */
    uint32_t pad;
    uint64_t value;
};

/* Forwards to peer `to` unless this is it; peer `to` answers value * 10 + its index. */
BS_KERNEL(hop) {
    size_t len = 0;
    const struct hop_args* in = (const struct hop_args*)bs_args(ctx, &len);
    if (len != sizeof *in) {
        bs_fail(ctx, 1, "hop: expected {to, pad, value}");
        return;
    }
    uint32_t peers = 0;
    int self = bs_self(ctx, &peers);
    if (self < 0) {
        bs_fail(ctx, 2, "hop: called without a peer table");
        return;
    }
    if ((uint32_t)self != in->to) {
        struct hop_args next = *in;
        if (bs_forward(ctx, in->to, &next, sizeof next) != BS_OK) bs_fail(ctx, 3, "hop: bs_forward refused");
        return;
    }
    uint64_t out = in->value * 10 + (uint64_t)self;
    bs_reply(ctx, &out, sizeof out);
}
