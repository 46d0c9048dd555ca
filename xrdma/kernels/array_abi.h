/* What the array kernels (reduce, filter), their native twins and the client agree on. */
#ifndef BITSHIP_XRDMA_ARRAY_ABI_H
#define BITSHIP_XRDMA_ARRAY_ABI_H

#include <stdint.h>

/* Each agent's "array" region holds one contiguous block of a global uint64_t array: agent a
 * holds items [a * items_per_agent, (a + 1) * items_per_agent). */
#define BS_ARRAY_REGION "array"

/* The splitmix64 finaliser: filter predicates and hash buckets are drawn from it. */
static inline uint64_t bs_mix64(uint64_t x) {
    x ^= x >> 30;
    x *= 0xbf58476d1ce4e5b9ull;
    x ^= x >> 27;
    x *= 0x94d049bb133111ebull;
    x ^= x >> 31;
    return x;
}

#endif
