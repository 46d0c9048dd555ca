/* A kernel that keeps state between calls: a counter in a writable global. The slice holding
 * it is compiled once, optimised, and never swapped (jit/entry_closure.hpp), so the count goes
 * on from call to call. */
#include <bitship/kernel.h>

static uint64_t calls;

BS_KERNEL(count_calls) {
    uint64_t n = ++calls;
    bs_reply(ctx, &n, sizeof n);
}
