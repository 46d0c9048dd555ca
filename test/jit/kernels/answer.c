/* Replies with VARIANT as a u64: build it with different -DVARIANT=n for distinct hashes that
 * define the same entry name. */
#include <bitship/kernel.h>

#ifndef VARIANT
#define VARIANT 0
#endif

BS_KERNEL(answer) {
    uint64_t value = VARIANT;
    bs_reply(ctx, &value, sizeof value);
}
