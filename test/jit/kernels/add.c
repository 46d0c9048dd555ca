/* Adds two u64 arguments (plus VARIANT, 0 unless built with -DVARIANT=n: the timing program
 * builds variants so each has a hash of its own). */
#include <bitship/kernel.h>

#ifndef VARIANT
#define VARIANT 0
#endif

struct add_args {
    uint64_t a, b;
};

BS_KERNEL(add) {
    size_t len;
    const struct add_args* in = (const struct add_args*)bs_args(ctx, &len);
    if (len != sizeof *in) {
        bs_fail(ctx, 1, "add: expected 16 bytes of arguments");
        return;
    }
    uint64_t sum = in->a + in->b + VARIANT;
    bs_reply(ctx, &sum, sizeof sum);
}
