/* Kernels that behave well and badly, for the agent's integration tests. */
#include <bitship/kernel.h>
#include <string.h>

struct add_args {
    uint64_t a, b;
};

BS_KERNEL(add) {
    size_t len;
    const struct add_args* in = (const struct add_args*)bs_args(ctx, &len);
    if (len != sizeof *in) {
        bs_fail(ctx, 1, "add: expected two uint64_t arguments");
        return;
    }
    uint64_t sum = in->a + in->b;
    bs_reply(ctx, &sum, sizeof sum);
}

/* Replies with its arguments: large ones travel by rendezvous both ways. */
BS_KERNEL(echo) {
    size_t len;
    const void* in = bs_args(ctx, &len);
    bs_reply(ctx, in, len);
}

BS_KERNEL(fail_with_42) { bs_fail(ctx, 42, "the answer is not allowed here"); }

BS_KERNEL(write_null) {
    volatile int* p = (volatile int*)0;
    *p = (int)(uintptr_t)ctx;
}

BS_KERNEL(spin_forever) {
    volatile uint64_t x = 0;
    for (;;) x = x + 1;
}

BS_KERNEL(reply_twice) {
    uint32_t one = 1, two = 2;
    int first = bs_reply(ctx, &one, sizeof one);
    int second = bs_reply(ctx, &two, sizeof two);
    (void)first;
    (void)second;
}

BS_KERNEL(silent) { (void)ctx; }

/* Counts to its 64-bit argument (about a nanosecond a step) and answers it: a kernel that
 * takes as long as it is told, without a clock. */
BS_KERNEL(busy_count) {
    size_t len;
    const uint64_t* n = (const uint64_t*)bs_args(ctx, &len);
    volatile uint64_t i = 0;
    uint64_t limit = len == sizeof *n ? *n : 0;
    while (i < limit) i = i + 1;
    uint64_t out = limit;
    bs_reply(ctx, &out, sizeof out);
}

/* Indirect calls to the kernel's own functions, through a table chosen by the argument: the
 * run-time check of policy rule no-forged-call lets these through. */
static uint64_t twice(uint64_t x) { return 2 * x; }
static uint64_t square(uint64_t x) { return x * x; }
static uint64_t (*const volatile operations[2])(uint64_t) = {twice, square};

BS_KERNEL(apply) {
    size_t len;
    const uint64_t* in = (const uint64_t*)bs_args(ctx, &len);
    if (len != 2 * sizeof(uint64_t) || in[0] > 1) {
        bs_fail(ctx, 1, "apply: expected an operation (0 or 1) and a value");
        return;
    }
    uint64_t r = operations[in[0]](in[1]);
    bs_reply(ctx, &r, sizeof r);
}

/* A call of a group (Client::ship_each) that does what its argument's top byte says, to its low
 * 56 bits: 0 answers value + 1, 1 fails with code `value`, 2 writes through a null pointer,
 * 3 spins forever, 4 answers `value` (at most 256) bytes of 0xab, 5 counts to `value` million and
 * answers `value` (a call that takes a while and returns). */
BS_KERNEL(group_member) {
    size_t len;
    const uint64_t* in = (const uint64_t*)bs_args(ctx, &len);
    if (len != sizeof *in) {
        bs_fail(ctx, 1, "group_member: expected one uint64_t");
        return;
    }
    uint64_t what = *in >> 56, value = *in & 0x00ffffffffffffffull;
    if (what == 0) {
        uint64_t out = value + 1;
        bs_reply(ctx, &out, sizeof out);
    } else if (what == 1) {
        bs_fail(ctx, (int)value, "group_member was told to fail");
    } else if (what == 2) {
        volatile int* p = (volatile int*)0;
        *p = 1;
    } else if (what == 3) {
        volatile uint64_t x = 0;
        for (;;) x = x + 1;
    } else if (what == 5) {
        volatile uint64_t x = 0;
        for (uint64_t i = 0; i < value * 1000000u; ++i) x = x + 1;
        bs_reply(ctx, &value, sizeof value);
    } else {
        unsigned char bytes[256];
        size_t n = value < sizeof bytes ? (size_t)value : sizeof bytes;
        memset(bytes, 0xab, n);
        bs_reply(ctx, bytes, n);
    }
}
