/* Built for aarch64 only: no slice for an x86_64 agent. */
#include <bitship/kernel.h>

BS_KERNEL(answer) {
    uint64_t v = 42;
    bs_reply(ctx, &v, sizeof v);
}
