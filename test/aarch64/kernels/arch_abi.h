/* What the arch kernels and the tests agree on. */
#ifndef BITSHIP_TEST_ARCH_ABI_H
#define BITSHIP_TEST_ARCH_ABI_H

#include <stdint.h>

enum { ARCH_X86_64 = 1, ARCH_AARCH64 = 2 };

struct arch_args {
    uint64_t a, b;
};

struct arch_reply {
    uint32_t arch;         /* ARCH_* of the slice that ran */
    uint32_t pointer_bits;
    uint64_t value;        /* arch_mix(a, b) */
};

struct hop_args {
    uint64_t to;        /* the peer to forward to */
    uint64_t forwarded; /* 0 on the first agent */
    uint64_t a, b;
};

#define ARCH_FNV_OFFSET 0xcbf29ce484222325ull
#define ARCH_FNV_PRIME 0x100000001b3ull

/* Multiplies, rotates and xors: enough arithmetic that a wrong slice or a wrong ABI shows. */
static inline uint64_t arch_mix(uint64_t a, uint64_t b) {
    uint64_t x = a * 0x9e3779b97f4a7c15ull + b;
    x ^= (x << 13) | (x >> 51);
    return x * 0xff51afd7ed558ccdull ^ (b >> 7);
}

#endif
