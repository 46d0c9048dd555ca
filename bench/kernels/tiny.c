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

/* Answers `n` bytes (its 8-byte argument, at most 16 MiB), each its offset's low byte: a bulk
 * result. The bytes are made once, on the first call, in a region of the agent's: memory a
 * kernel takes from malloc is the call's own and freed when it returns, and a static array
 * would make every compiled copy of this bundle 16 MiB larger. */
#define MAKE_BYTES_MAX (16u << 20)
BS_KERNEL(make_bytes) {
    size_t len;
    const uint64_t* n = (const uint64_t*)bs_args(ctx, &len);
    if (len != sizeof *n) {
        bs_fail(ctx, 1, "make_bytes: expected one uint64_t");
        return;
    }
    size_t size = 0;
    unsigned char* buf = (unsigned char*)bs_region_create(ctx, "bench.make_bytes", MAKE_BYTES_MAX, &size);
    if (!buf || size < MAKE_BYTES_MAX) {
        bs_fail(ctx, 2, "make_bytes: cannot make its 16 MiB region");
        return;
    }
    /* A new region is zeroed: the last byte is written last, so 0xff there means filled. */
    if (buf[MAKE_BYTES_MAX - 1] != 0xff)
        for (uint64_t i = 0; i < MAKE_BYTES_MAX; ++i) buf[i] = (unsigned char)i;
    bs_reply(ctx, buf, *n < MAKE_BYTES_MAX ? *n : MAKE_BYTES_MAX);
}
