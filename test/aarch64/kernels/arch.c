/* Kernels that say which slice of their bundle ran: built twice, into a two-slice bundle
 * (x86_64 + aarch64) and an x86_64-only one. */
#include <bitship/kernel.h>

#include "arch_abi.h"

/* Which architecture this slice was compiled for, and a value computed from the arguments. */
BS_KERNEL(which_arch) {
    size_t len = 0;
    const struct arch_args* in = (const struct arch_args*)bs_args(ctx, &len);
    if (len != sizeof *in) {
        bs_fail(ctx, 1, "which_arch: expected two uint64_t");
        return;
    }
    struct arch_reply out;
#if defined(__aarch64__)
    out.arch = ARCH_AARCH64;
#elif defined(__x86_64__)
    out.arch = ARCH_X86_64;
#else
    out.arch = 0;
#endif
    out.pointer_bits = (uint32_t)(sizeof(void*) * 8);
    out.value = arch_mix(in->a, in->b);
    bs_reply(ctx, &out, sizeof out);
}

/* FNV-1a over the argument bytes, however many: large arguments travel by rendezvous. */
BS_KERNEL(fnv1a) {
    size_t len = 0;
    const unsigned char* p = (const unsigned char*)bs_args(ctx, &len);
    uint64_t h = ARCH_FNV_OFFSET;
    for (size_t i = 0; i < len; ++i) h = (h ^ p[i]) * ARCH_FNV_PRIME;
    bs_reply(ctx, &h, sizeof h);
}

/* Forwards itself once to peer `to`, where it answers as which_arch does. */
BS_KERNEL(hop_then_answer) {
    size_t len = 0;
    const struct hop_args* in = (const struct hop_args*)bs_args(ctx, &len);
    if (len != sizeof *in) {
        bs_fail(ctx, 1, "hop_then_answer: expected struct hop_args");
        return;
    }
    if (!in->forwarded) {
        struct hop_args next = *in;
        next.forwarded = 1;
        int rc = bs_forward(ctx, (uint32_t)in->to, &next, sizeof next);
        if (rc != BS_OK) bs_fail(ctx, 2, "hop_then_answer: bs_forward refused");
        return;
    }
    struct arch_reply out;
#if defined(__aarch64__)
    out.arch = ARCH_AARCH64;
#elif defined(__x86_64__)
    out.arch = ARCH_X86_64;
#else
    out.arch = 0;
#endif
    out.pointer_bits = (uint32_t)(sizeof(void*) * 8);
    out.value = arch_mix(in->a, in->b);
    bs_reply(ctx, &out, sizeof out);
}
