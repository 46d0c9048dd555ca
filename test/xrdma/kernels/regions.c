/* A kernel that makes a region of its own and fills it, for the region tests. */
#include <bitship/kernel.h>

BS_KERNEL(make_scratch) {
    size_t size = 0;
    unsigned char* p = (unsigned char*)bs_region_create(ctx, "scratch", 4096, &size);
    if (!p) {
        bs_fail(ctx, 1, "cannot create region 'scratch'");
        return;
    }
    for (size_t i = 0; i < size; ++i) p[i] = (unsigned char)(i * 7);
    uint64_t out = size;
    bs_reply(ctx, &out, sizeof out);
}

/* Forwards to the next peer forever: only the hop budget stops it. */
BS_KERNEL(ping_pong) {
    uint32_t peers = 0;
    int self = bs_self(ctx, &peers);
    if (self < 0) {
        bs_fail(ctx, 1, "ping_pong needs a peer table");
        return;
    }
    uint64_t hops = 0;
    size_t len;
    const uint64_t* in = (const uint64_t*)bs_args(ctx, &len);
    if (len == sizeof hops) hops = *in + 1;
    bs_forward(ctx, (uint32_t)((self + 1) % peers), &hops, sizeof hops);
}

/* Hands the call to kernel `answer_here` on the next peer. */
BS_KERNEL(hand_over) {
    uint32_t peers = 0;
    int self = bs_self(ctx, &peers);
    uint64_t from = (uint64_t)self;
    if (bs_ship(ctx, (uint32_t)((self + 1) % peers), "answer_here", &from, sizeof from) != BS_OK)
        bs_fail(ctx, 1, "bs_ship refused");
}

/* Answers which peer it ran on and which peer handed it over. */
BS_KERNEL(answer_here) {
    size_t len;
    const uint64_t* from = (const uint64_t*)bs_args(ctx, &len);
    uint32_t peers = 0;
    uint64_t out[2] = {(uint64_t)bs_self(ctx, &peers), len == 8 ? *from : 99};
    bs_reply(ctx, out, sizeof out);
}

/* Peer 0 forwards to peer 1, which never returns: for losing the peer mid-call. */
BS_KERNEL(forward_then_spin) {
    uint32_t peers = 0;
    int self = bs_self(ctx, &peers);
    if (self == 0) {
        uint64_t zero = 0;
        bs_forward(ctx, 1, &zero, sizeof zero);
        return;
    }
    volatile uint64_t x = 0;
    for (;;) x = x + 1;
}
