/* Example kernels: small arithmetic shipped to an agent. */
#include <bitship/kernel.h>
#include <math.h>

struct add_args {
    uint64_t a, b;
};

/* a + b */
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

/* Does nothing and answers nothing: the cost of a call itself. */
BS_KERNEL(empty) { (void)ctx; }

/* Steps of the Collatz sequence from n down to 1: some work, no memory. */
BS_KERNEL(collatz) {
    size_t len;
    const uint64_t* n = (const uint64_t*)bs_args(ctx, &len);
    if (len != sizeof *n || *n == 0) {
        bs_fail(ctx, 1, "collatz: expected one non-zero uint64_t");
        return;
    }
    uint64_t x = *n, steps = 0;
    while (x != 1) {
        x = (x & 1) ? 3 * x + 1 : x / 2;
        ++steps;
    }
    bs_reply(ctx, &steps, sizeof steps);
}

/* Euclidean norm of the doubles passed as arguments (uses libm's sqrt). */
BS_KERNEL(norm) {
    size_t len;
    const double* v = (const double*)bs_args(ctx, &len);
    double sum = 0;
    for (size_t i = 0; i < len / sizeof(double); ++i) sum += v[i] * v[i];
    double r = sqrt(sum);
    bs_reply(ctx, &r, sizeof r);
}
