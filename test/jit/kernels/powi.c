/* llvm.powi is an intrinsic in the IR (it passes the allow-list check) that the backend lowers
 * to a call to __powidf2, which no agent exports: the link must fail and name it. */
#include <bitship/kernel.h>

BS_KERNEL(power) {
    size_t len;
    const double* x = (const double*)bs_args(ctx, &len);
    volatile int n = 7;
    double y = __builtin_powi(*x, n);
    bs_reply(ctx, &y, sizeof y);
}
