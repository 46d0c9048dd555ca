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
 * result. The bytes are made once, on the first call, in memory from malloc (a static array
 * would make every compiled copy of this bundle 16 MiB larger). */
#define MAKE_BYTES_MAX (16u << 20)
void* malloc(size_t);
BS_KERNEL(make_bytes) {
    size_t len;
    const uint64_t* n = (const uint64_t*)bs_args(ctx, &len);
    if (len != sizeof *n) {
        bs_fail(ctx, 1, "make_bytes: expected one uint64_t");
        return;
    }
    static unsigned char* buf;
    if (!buf) {
        unsigned char* b = (unsigned char*)malloc(MAKE_BYTES_MAX);
        if (!b) {
            bs_fail(ctx, 2, "make_bytes: out of memory");
            return;
        }
        for (uint64_t i = 0; i < MAKE_BYTES_MAX; ++i) b[i] = (unsigned char)i;
        buf = b;
    }
    bs_reply(ctx, buf, *n < MAKE_BYTES_MAX ? *n : MAKE_BYTES_MAX);
}
