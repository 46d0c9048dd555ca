/* Uses allow-listed libc/libm: square roots of up to 8 doubles. The variable-length memcpy
 * stays a call (through llvm.memcpy, lowered by the backend), and sqrt is a libm call. */
#include <bitship/kernel.h>
#include <math.h>
#include <string.h>

enum { kMaxValues = 8 };

BS_KERNEL(roots) {
    size_t len;
    const void* in = bs_args(ctx, &len);
    double values[kMaxValues];
    if (len % sizeof(double) != 0 || len > sizeof values) {
        bs_fail(ctx, 1, "roots: expected up to 8 doubles");
        return;
    }
    memcpy(values, in, len);
    size_t n = len / sizeof(double);
    for (size_t i = 0; i < n; ++i) values[i] = sqrt(values[i]);
    bs_reply(ctx, values, len);
}
