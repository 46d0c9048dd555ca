/* Example kernel: works on bytes, replies with a variable-length result. */
#include <bitship/kernel.h>
#include <string.h>

/* The argument bytes, reversed. */
BS_KERNEL(reverse) {
    size_t len;
    const unsigned char* in = (const unsigned char*)bs_args(ctx, &len);
    unsigned char buf[4096];
    if (len > sizeof buf) {
        bs_fail(ctx, 2, "reverse: at most 4096 bytes");
        return;
    }
    for (size_t i = 0; i < len; ++i) buf[i] = in[len - 1 - i];
    bs_reply(ctx, buf, len);
}

/* FNV-1a hash of the argument bytes. */
BS_KERNEL(fnv1a) {
    size_t len;
    const unsigned char* in = (const unsigned char*)bs_args(ctx, &len);
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < len; ++i) h = (h ^ in[i]) * 1099511628211ull;
    bs_reply(ctx, &h, sizeof h);
}
