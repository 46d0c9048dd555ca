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
