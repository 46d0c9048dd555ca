/* The kernels the latency benchmark ships: as small as a kernel gets. */
#include <bitship/kernel.h>

/* Reads its arguments and answers nothing: the cost of a call itself. */
BS_KERNEL(empty) {
    size_t len;
    (void)bs_args(ctx, &len);
}

/* Answers its 8-byte argument plus one. */
BS_KERNEL(inc) {
    size_t len;
    const uint64_t* x = (const uint64_t*)bs_args(ctx, &len);
    uint64_t y = len == sizeof *x ? *x + 1 : 0;
    bs_reply(ctx, &y, sizeof y);
}

/* Reads every byte of its arguments (8 bytes at a time) and answers their xor: what a kernel
 * given bulk data does at least. */
BS_KERNEL(xor_bytes) {
    size_t len;
    const uint64_t* words = (const uint64_t*)bs_args(ctx, &len);
    uint64_t x = 0;
    for (size_t i = 0; i < len / sizeof *words; ++i) x ^= words[i];
    bs_reply(ctx, &x, sizeof x);
}

/* Answers `n` bytes (its 8-byte argument), each its offset's low byte: a bulk result. The
 * bytes are made once, so a call costs the reply itself. */
BS_KERNEL(make_bytes) {
    size_t len;
    const uint64_t* n = (const uint64_t*)bs_args(ctx, &len);
    if (len != sizeof *n) {
        bs_fail(ctx, 1, "make_bytes: expected one uint64_t");
        return;
    }
    static unsigned char buf[16u << 20];
    static int made;
    if (!made) {
        for (uint64_t i = 0; i < sizeof buf; ++i) buf[i] = (unsigned char)i;
        made = 1;
    }
    bs_reply(ctx, buf, *n < sizeof buf ? *n : sizeof buf);
}
